"""argparse types shared by the command-line programs: counts bounded with a message (exit status 2
naming the option, the value and the range, before anything is allocated)."""
from __future__ import annotations

import argparse

from rgpt_dist.eval.phi.fit import MAX_SAMPLES, MAX_STARTS, REFIT_RESTARTS


def count(cap: int | None = None, why: str = ""):
    """argparse type: an integer >= 1 (and <= cap); argparse names the option, exit status 2."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1 or (cap is not None and value > cap):
            bound = f"from 1 to {cap:,} ({why})" if cap is not None else ">= 1"
            raise argparse.ArgumentTypeError(f"{text!r} is out of range: an integer {bound}")
        return value
    return parse


# the phi fit's counts: every start of one fit (restarts) or of the bootstrap (resamples x 17 starts) runs
# in lockstep, ~25 KiB each (rgpt_dist.eval.phi.fit.MAX_STARTS: at most ~1 GiB)
RESTARTS_ARG = count(MAX_STARTS, "a fit runs its L-BFGS-B starts in lockstep, ~25 KiB each: ~1 GiB at the cap")
BOOTSTRAP_ARG = count(MAX_SAMPLES, f"each resample refits from {1 + REFIT_RESTARTS} L-BFGS-B starts, all in lockstep, "
                                 f"~25 KiB each: {MAX_STARTS:,} starts, ~1 GiB at the cap")
