"""Open a dataset in several processes at the same moment, as jobs sharing a node do (the
registration-race test): `python -m tests.data.open_together DATASET N` prints one line per process,
`ok` or the error."""
import multiprocessing as mp
import sys


def _open(root: str, barrier, results) -> None:
    from rgpt_dist.data.streaming import token_dataset
    barrier.wait()
    try:
        dataset = token_dataset(root, "train", batch_size=2)
        results.put("ok")
        barrier.wait()  # everyone registered before anyone lets go of its segments
        del dataset
    except Exception as err:  # reported to the test, which shows it
        results.put(f"{type(err).__name__}: {err}")
        barrier.abort()


if __name__ == "__main__":
    root, n = sys.argv[1], int(sys.argv[2])
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_open, args=(root, barrier, results)) for _ in range(n)]
    for proc in procs:
        proc.start()
    print("\n".join(results.get(timeout=120) for _ in procs), flush=True)
    for proc in procs:
        proc.join(timeout=60)
