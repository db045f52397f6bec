"""rgpt-dist: distributed pretraining of recurrent-depth transformers (RecurrentGPT and baselines)."""

__version__ = "0.1.0"
