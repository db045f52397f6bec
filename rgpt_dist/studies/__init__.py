"""The studies, one home each: its plan (runs and their configs), its cluster grid (the generator of
its configs/experiments/* and slurm/*.sh) and its report, behind the `Study` protocol (base.py) that
`rgpt study NAME run|report|grid` drives (runner.py). No torch import.

    compare       make compare: every model of a scaled-down Table 1 cell; grid: the paper's Table 1 grid
    compare-long  make compare-long: the same cell at 10x the tokens, two seeds each, kept in results/
    ablation      make ablation: the rows of Fig. 5 on the compare cell; grid: the paper's ablations
    phi           make phi: the looped scaling law's iso-depth sweep and fit; grid: the 380-run sweep
    rt-compare    make compare-rt: the Recurrent Transformer against its dense partner; grid: the authors'
    rlt           make rlt: the RLT headline, parity and swaps-S5 (length generalisation)
    algorithmic   make algorithmic: parity and swaps-S5 with the Transformer baseline
    thinking      make thinking: the silent-thinking graph task's frontier
"""
from __future__ import annotations

import importlib

from rgpt_dist.studies.base import Study

_HOMES = {"compare": ("compare", "COMPARE"), "compare-long": ("compare", "COMPARE_LONG"),
          "ablation": ("ablation", "ABLATION"), "phi": ("phi", "PHI"), "rt-compare": ("rt_compare", "RT_COMPARE"),
          "rlt": ("algorithmic", "RLT_STUDY"), "algorithmic": ("algorithmic", "ALGORITHMIC"),
          "thinking": ("thinking", "THINKING")}
NAMES = tuple(_HOMES)


def study(name: str) -> Study:
    """The study called `name` (its package is imported only now: each pulls in its own reports)."""
    if name not in _HOMES:
        raise KeyError(f"no study {name!r}: the studies are {', '.join(NAMES)}")
    package, attr = _HOMES[name]
    return getattr(importlib.import_module(f"rgpt_dist.studies.{package}"), attr)
