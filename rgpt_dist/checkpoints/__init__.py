"""Reading what training and export write, below all three of train, export and eval, which read
it: a checkpoint's completion record (record), its consolidation to one tensor-parallel-free
state dict (consolidate), the native export format (native), and "a model from a run directory,
checkpoint or export" (source)."""
