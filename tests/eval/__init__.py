"""Tests of rgpt_dist.eval."""
