"""Open a dataset, read one batch, print READY and wait to be killed (for the stale-state test)."""
import sys
import time

from rgpt_dist.data.streaming import token_dataset, token_loader

loader = token_loader(token_dataset(sys.argv[1], "train", batch_size=2), batch_size=2)
next(iter(loader))
print("READY", flush=True)
time.sleep(600)
