"""Evaluation: downstream tasks, early-exit curves and the Appendix E diagnostics."""
