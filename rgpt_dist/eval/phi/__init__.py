"""The looped scaling law (issue #26): fit phi with bootstrap intervals (fit.py, on lbfgsb.py's lockstep
L-BFGS-B) and write its report (report.py). No torch import."""
from rgpt_dist.eval.phi.fit import (Bootstrap, LawFit, Observation, PhiInputError, bootstrap, check_observations,
                                    fit_law, objective)

__all__ = ["Bootstrap", "LawFit", "Observation", "PhiInputError", "bootstrap", "check_observations", "fit_law",
           "objective"]
