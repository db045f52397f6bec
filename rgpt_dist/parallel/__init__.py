"""Parallelism applied to plain models from outside: process groups, ZeRO, activation checkpointing."""
