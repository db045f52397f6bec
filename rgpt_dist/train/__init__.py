"""Training: optimizer and schedule, the DeepSpeed engine, the loop, checkpoints and metrics."""
