"""Reading training samples from object storage against the same dataset on local disk: a cold
cache (every shard downloaded as the reader reaches it) and a warm one (a rerun or a requeued job on
the same node: the cache already holds every shard).

    .venv/bin/python benchmarks/remote_stream.py             # the CPython standard library, seq_len 1024, 4 MB shards
    .venv/bin/python benchmarks/remote_stream.py --quick     # the test corpus at seq_len 32, 50 KB shards (the smoke test's)
    .venv/bin/python benchmarks/remote_stream.py --sabotage  # the cache emptied before the warm pass: must fail

The server is moto's S3 server (tests/helpers/s3.py) on this host: a download costs the protocol,
streaming's download path and our per-shard check (rgpt_dist.data.verify), but no network. An
endpoint's bandwidth is emulated (--bandwidth-mbs, default 20 MB/s: each shard download is held
until its bytes would have arrived at that rate); 0 leaves the loopback's speed. One process
reads every training sample once through rgpt_dist.data.streaming's loader (one rank, no workers,
the trainer's micro-batch), after a warm-up pass over the local copy so the page cache holds it.
Bar (printed, exit 1 when missed): the warm pass reads at least 0.8x as fast as the local one (what
it adds: checking each cached shard once when the dataset opens).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BAR = 0.8


def _read(uri: str, cache: Path | None, batch: int) -> tuple[int, float]:
    from rgpt_dist.data.streaming import token_dataset, token_loader

    start = time.perf_counter()
    ds = token_dataset(uri, "train", batch_size=batch, shuffle=True, cache_dir=str(cache) if cache else None,
                       vocab_size=50257)
    n = sum(x.shape[0] for x, _ in token_loader(ds, batch))
    took = time.perf_counter() - start
    del ds
    return n, took


def _emulate_bandwidth(mb_per_s: float) -> None:
    """Hold every S3 download until its bytes would have arrived at mb_per_s."""
    from rgpt_dist.data.mds import import_streaming

    import_streaming()
    from streaming.base.storage.download import S3Downloader

    fetch = S3Downloader._download_file_impl

    def slow(self, remote: str, local: str, timeout: float) -> None:
        start = time.perf_counter()
        fetch(self, remote, local, timeout)
        time.sleep(max(0.0, os.path.getsize(local) / (mb_per_s * 1e6) - (time.perf_counter() - start)))

    S3Downloader._download_file_impl = slow


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the test corpus at seq_len 32 (the smoke test's size)")
    p.add_argument("--sabotage", action="store_true", help="empty the cache before the warm pass")
    p.add_argument("--bandwidth-mbs", type=float, default=20.0, help="emulated endpoint bandwidth, MB/s (0: none)")
    p.add_argument("--dir", default=None, help="scratch directory (default: a temporary one, removed)")
    args = p.parse_args(argv)
    from tests.helpers.corpus import CORPUS
    from tests.helpers.s3 import S3Server

    corpus, seq_len, shard_mb, batch = (str(CORPUS), 32, 0.05, 8) if args.quick else ("python-stdlib", 1024, 4.0, 8)
    scratch = Path(tempfile.mkdtemp(dir=args.dir))
    server = S3Server().start()
    try:
        os.environ.update(server.env())
        server.client().create_bucket(Bucket="bench")
        local = scratch / "local"
        subprocess.run([sys.executable, "-m", "data_prep.cli", corpus, "--out", "s3://bench/ds", "--local",
                        str(local), "--seq-len", str(seq_len), "--shard-mb", str(shard_mb), "--workers", "2"],
                       cwd=ROOT, check=True, capture_output=True)
        shards = len(list((local / "train").rglob("*.mds")))
        mb = sum(f.stat().st_size for f in (local / "train").rglob("*.mds")) / 1e6
        if args.bandwidth_mbs > 0:
            _emulate_bandwidth(args.bandwidth_mbs)
        cache = scratch / "cache"
        cache.mkdir(mode=0o700)
        _read(str(local), None, batch)  # the page cache warm for the local pass
        rows = {"local": _read(str(local), None, batch), "s3, cold cache": _read("s3://bench/ds", cache, batch)}
        if args.sabotage:
            shutil.rmtree(cache)
            cache.mkdir(mode=0o700)
        rows["s3, warm cache"] = _read("s3://bench/ds", cache, batch)
    finally:
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    base = rows["local"][0] / rows["local"][1]
    link = f"{args.bandwidth_mbs:g} MB/s emulated" if args.bandwidth_mbs > 0 else "the loopback's speed"
    print(f"train split: {shards} shards, {mb:.1f} MB, seq_len {seq_len}; moto S3 on this host at {link}"
          f"{'; SABOTAGED: the cache emptied before the warm pass' if args.sabotage else ''}\n")
    print("| source | samples | seconds | samples/s | vs local |\n|---|---|---|---|---|")
    for name, (n, took) in rows.items():
        print(f"| {name} | {n:,} | {took:.2f} | {n / took:,.0f} | {n / took / base:.2f} |")
    warm = rows["s3, warm cache"][0] / rows["s3, warm cache"][1] / base
    ok = warm >= BAR
    print(f"\nbar: warm cache >= {BAR}x local: {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
