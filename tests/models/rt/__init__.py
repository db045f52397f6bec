"""The layerwise Recurrent Transformer (rgpt_dist/models/rt, issue 27)."""
