"""Progress bars for the commands that run for more than a few seconds (tqdm): steps, evaluation
batches, bootstrap resamples, frontier cells, a study's runs, each with its rate and ETA.

A bar is drawn on stderr only when stderr is a terminal and RGPT_QUIET is not set (`--quiet` on a
command sets it, so the processes it starts stay quiet too): logs, CI and pipes get the commands'
own lines, unchanged.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable, TypeVar

from tqdm import tqdm

QUIET = "RGPT_QUIET"
T = TypeVar("T")


def quiet() -> None:
    """No bars in this process or the ones it starts (`--quiet`)."""
    os.environ[QUIET] = "1"


def enabled() -> bool:
    return not os.environ.get(QUIET) and sys.stderr.isatty()


def bar(iterable: Iterable[T] | None = None, *, total: int | None = None, desc: str = "",
        unit: str = "it") -> tqdm:
    """A tqdm bar over `iterable` (or one updated by hand up to `total`), disabled where enabled()
    is false: iterating it then costs what iterating the iterable costs."""
    return tqdm(iterable, total=total, desc=desc, unit=unit, disable=not enabled(), dynamic_ncols=True,
                leave=False, file=sys.stderr)
