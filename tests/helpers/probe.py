"""A launch target for tests/helpers/test_dist.py: `python -m tests.helpers.probe OUT MODE`.

Every rank all-reduces its rank over gloo and writes OUT.RANK.json (its launcher environment and the
sum); MODE `fail` makes rank 1 raise after that and rank 0 wait for a collective that never comes,
MODE `hang` makes every rank sleep."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "OMP_NUM_THREADS", "PYTHONPATH")


def main(out: str, mode: str) -> None:
    if mode == "hang":
        time.sleep(600)
    dist.init_process_group("gloo")
    total = torch.tensor([dist.get_rank()])
    dist.all_reduce(total)
    env = {k: os.environ.get(k) for k in KEYS}
    with open(f"{out}.{dist.get_rank()}.json", "w") as f:
        json.dump({"env": env, "sum": total.item(), "threads": torch.get_num_threads(), "cwd": os.getcwd()}, f)
    print(f"rank {dist.get_rank()} wrote its probe")
    if mode == "fail":
        if dist.get_rank() == 1:
            raise RuntimeError("rank 1 fails on purpose")
        dist.barrier()  # never completes: rank 1 is gone
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
