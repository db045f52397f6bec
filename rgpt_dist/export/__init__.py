"""Export of trained checkpoints: consolidation and Hugging Face directories."""
