"""Checks that need the world size or the filesystem, run on every rank before any heavy
initialisation (the config itself was validated by Config.validate)."""
from __future__ import annotations

from pathlib import Path

from rgpt_dist.config.experiment import Config
from rgpt_dist.data.index import DatasetError, check_split
from rgpt_dist.data.streaming import fetch_index
from rgpt_dist.data.suites import source_problems, validation_problem
from rgpt_dist.data.uri import RemoteDataError
from rgpt_dist.data.verify import check_split_data
from rgpt_dist.train.init_from import source_problem, wanted


def preflight(cfg: Config, world_size: int) -> list[str]:
    """Problems that would only surface after minutes of start-up, each naming the values involved."""
    out = []
    t, p = cfg.train, cfg.parallel
    if world_size % p.tp_size:
        out.append(f"world size {world_size} is not divisible by parallel.tp_size={p.tp_size}")
        return out
    dp = world_size // p.tp_size
    if t.global_batch_size % (t.micro_batch_size * dp):
        out.append(f"train.global_batch_size={t.global_batch_size} is not divisible by train.micro_batch_size="
                   f"{t.micro_batch_size} x {dp} data-parallel ranks")
    out += source_problems(cfg)
    splits = [cfg.data.train_split] + ([cfg.data.val_split] if cfg.eval.every_steps > 0 else [])
    if cfg.data.task and cfg.eval.every_steps > 0:  # a task is generated: data.paths are unused
        out += validation_problem(cfg, dp)
    for i, root in enumerate([] if cfg.data.task else cfg.data.paths):
        problems = _remote_problems(root, splits, t.seq_len, cfg.data) if "://" in root \
            else _split_problems(Path(root), splits, t.seq_len, cfg.model.vocab_size)
        out += [f"data.paths[{i}]={root!r}: {problem}" for problem in problems]
    run_dir = Path(cfg.log.run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        out.append(f"log.run_dir={cfg.log.run_dir!r} exists and is not a directory")
    if cfg.checkpoint.dir and Path(cfg.checkpoint.dir).is_file():
        out.append(f"checkpoint.dir={cfg.checkpoint.dir!r} is a file")
    if wanted(cfg):
        out += [p for p in [source_problem(cfg.checkpoint.init_from)] if p]
    return out


def _seq_len_problem(split: str, shards: list[dict], seq_len: int) -> str | None:
    lengths = {s["column_sizes"][0] // 2 - 1 for s in shards}
    if lengths and lengths != {seq_len}:
        return f"{split} holds samples of seq_len {sorted(lengths)[0]}, but train.seq_len={seq_len}"
    return None


def _remote_problems(root: str, splits: list[str], seq_len: int, data) -> list[str]:
    """Each split's index fetched from object storage and checked as the loader will, and its
    sample length against train.seq_len: an endpoint that does not answer, a wrong prefix, another
    sequence length or a cache holding another version of the dataset is refused before the run
    starts. The shards themselves are checked as the cache receives them
    (rgpt_dist.data.streaming.SafeStream)."""
    out = []
    for split in splits:
        try:
            shards = fetch_index(root, split, data.download_timeout_s, data.cache_dir or None)
            problem = _seq_len_problem(split, shards, seq_len)
        except (DatasetError, RemoteDataError) as e:
            problem = str(e)
        out += [problem] if problem else []
    return out


def _split_problems(root: Path, splits: list[str], seq_len: int, vocab_size: int) -> list[str]:
    """Each split's index checked as the loader will (rgpt_dist.data.index: token columns only,
    shard files inside the split), its sample length against train.seq_len, and its shard files
    (rgpt_dist.data.verify: offsets inside the file, every token id below model.vocab_size; this
    reads the whole dataset once per rank, from the page cache after the first: see that module for
    the cost). A remote dataset's are checked as they arrive: _remote_problems."""

    out = []
    for split in splits:
        if not (root / split / "index.json").is_file():
            out.append(f"no {split}/index.json (prepare it with rgpt-prep)")
            continue
        try:
            shards = check_split(root / split)
        except DatasetError as e:
            out.append(str(e))
            continue
        if problem := _seq_len_problem(split, shards, seq_len):
            out.append(problem)
            continue
        try:
            check_split_data(root / split, shards, vocab_size)
        except DatasetError as e:
            out.append(str(e))
    return out
