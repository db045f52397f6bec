"""Model families: plain PyTorch, one family per file, layers from an injected LayerFactory."""
