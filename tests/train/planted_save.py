"""Under torchrun: train() itself, past the launcher's pre-start checks (as if a link had been planted
after the start), returning its exit status (a refused save, a refused resume). Each rank writes its
exit status and stderr to OUT.rankN. Args: CONFIG OUT key=value..."""
import contextlib
import io
import json
import os
import sys

from rgpt_dist.config import load_config
from rgpt_dist.train.run import train

config, out, *overrides = sys.argv[1:]
err = io.StringIO()
with contextlib.redirect_stderr(err):
    status = train(load_config(config, overrides))
with open(f"{out}.rank{os.environ['RANK']}", "w") as f:
    json.dump({"status": status, "stderr": err.getvalue()}, f)
