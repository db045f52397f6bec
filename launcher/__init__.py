"""Thin entry points: each composes library pieces and starts with the exact command it serves."""
