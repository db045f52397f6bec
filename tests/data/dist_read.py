"""Run under torchrun: each rank records what it reads from an rgpt-prep dataset.

    python -m torch.distributed.run --nproc_per_node 2 -m tests.data.dist_read OUT_JSON DATASET MODE [K]

MODE all: read the whole train split; MODE first K: read K batches and save the loader state;
MODE resume: load the saved state and read the rest.
"""
import hashlib
import json
import os
import sys

import torch.distributed as dist


def main():
    out, root, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    k = int(sys.argv[4]) if len(sys.argv) > 4 else 0
    dist.init_process_group("gloo")
    from rgpt_dist.data.streaming import cleanup_stale_state, token_dataset, token_loader
    rank = dist.get_rank()
    cleanup_stale_state()
    ds = token_dataset(root, "train", batch_size=2, shuffle=True, seed=7, num_canonical_nodes=2)
    loader = token_loader(ds, batch_size=2)
    state_file = f"{out}.state{rank}.json"
    if mode == "resume":
        with open(state_file) as f:
            loader.load_state_dict(json.load(f))
    batches = []
    for x, y in loader:
        assert (x[:, 1:] == y[:, :-1]).all()
        batches.append([hashlib.sha1(row.numpy().tobytes()).hexdigest() for row in x])
        if mode == "first" and len(batches) == k:  # stop without drawing batch k + 1
            break
    if mode == "first":
        with open(state_file, "w") as f:
            json.dump(loader.state_dict(), f)
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump({"rank": rank, "world": dist.get_world_size(), "samples": len(ds), "batches": batches}, f)
    dist.barrier()
    del loader, ds
    cleanup_stale_state()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
