"""Resuming on another layout (rgpt_dist/parallel/universal.py): a run checkpointed at step 4 of 8 at
one (ZeRO stage, tp, data-parallel size) resumes at another through DeepSpeed's universal checkpoint,
as a requeue onto fewer or more nodes does. The global batch stays 8 sequences (the accumulation
adapts), the data stream continues at the next global sample (streaming's elastic resumption,
checked by sample ids: every run logs a hash of each sequence it trains on, RGPT_SAMPLE_LOG, and
each of steps 5-8 after the change trains on exactly the sequences the uninterrupted runs at either
layout train on at that step), and steps 5-8 follow an uninterrupted run at the new layout to within the error that
changing the layout alone causes: |converted - new| <= (4 r + 4 eps32) |new|, where r is the largest
relative difference between uninterrupted runs at the two layouts over the run (in bf16 it swings
from step to step: 3.6e-4 at step 1, 1.6e-7 at step 8), and the final fp32 weights likewise
(tests/helpers/tolerance.py's reasoning). What DeepSpeed
cannot convert is refused at start with exit 2 on every rank, nothing written."""
import json
import shutil

import pytest
import torch

from rgpt_dist.checkpoints.consolidate import consolidate
from rgpt_dist.train.sample_log import ENV, read_sample_log
from tests.helpers.dist import torchrun
from tests.helpers.runs import COMMON, QUICKSTART, launch, records
from tests.helpers.tolerance import EPS32

pytestmark = pytest.mark.slow

RUN = ["model.sigma_x=0", "model.sigma_g=0", "train.max_steps=8", "eval.every_steps=0", "checkpoint.every_steps=4",
       "model.pad_vocab_multiple=256"]
# (ZeRO stage, ranks, tp[, dtype]) before -> after; fp32 unless named (bf16: DeepSpeed's bf16 optimizer,
# the grid's precision, whose partitions are bf16_zero_pp_rank_* files)
CASES = {"zero1-dp2-to-dp1": ((1, 2, 1), (1, 1, 1)), "zero1-dp2-to-dp4": ((1, 2, 1), (1, 4, 1)),
         "zero2-dp2-to-dp1": ((2, 2, 1), (2, 1, 1)), "zero2-dp2-to-dp4": ((2, 2, 1), (2, 4, 1)),
         "zero3-dp2-to-dp4": ((3, 2, 1), (3, 4, 1)), "zero3-dp2-to-dp1": ((3, 2, 1), (3, 1, 1)),
         "zero2-tp2-to-tp1": ((2, 2, 2), (2, 1, 1)), "zero2-bf16-dp2-to-dp1": ((2, 2, 1, "bf16"), (2, 1, 1, "bf16"))}


def layout(stage: int, tp: int, dtype: str = "fp32") -> list[str]:
    return [f"parallel.zero_stage={stage}", f"parallel.tp_size={tp}", f"parallel.dtype={dtype}"]


@pytest.fixture(scope="module")
def uninterrupted(dataset, tmp_path_factory):
    """(stage, ranks, tp) -> the run directory of an uninterrupted run at that layout (made once)."""
    made = {}

    def get(stage: int, ranks: int, tp: int, dtype: str = "fp32"):
        if (stage, ranks, tp, dtype) not in made:
            run = tmp_path_factory.mktemp(f"z{stage}-n{ranks}-tp{tp}-{dtype}")
            launch(ranks, run, dataset, *RUN, *layout(stage, tp, dtype), env={ENV: str(run / "samples")})
            made[stage, ranks, tp, dtype] = run
        return made[stage, ranks, tp, dtype]
    return get


def steps(run) -> dict[int, dict]:
    return {r["step"]: r for r in records(run) if "loss" in r}


@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_resumes_at_another_layout(case, uninterrupted, dataset, tmp_path):
    (s0, n0, tp0, *dtype), (s1, n1, tp1, *_) = CASES[case]
    old, new = uninterrupted(s0, n0, tp0, *dtype), uninterrupted(s1, n1, tp1, *dtype)
    run = tmp_path / "run"  # the old run as a requeue finds it after step 4: its checkpoint of step 4
    shutil.copytree(old, run, ignore=shutil.ignore_patterns("step_00000008", "wandb"))
    stdout = launch(n1, run, dataset, *RUN, *layout(s1, tp1, *dtype), env={ENV: str(tmp_path / "samples")})
    before = f"ZeRO-{s0}, tp = {tp0}, dp = {n0 // tp0}"
    after = f"ZeRO-{s1}, tp = {tp1}, dp = {n1 // tp1}"
    assert f"converted step_00000004 ({before} -> {after}) through DeepSpeed's universal checkpoint" in stdout
    assert f"resumed from {run / 'checkpoints' / 'step_00000004'} at step 4" in stdout
    got, a, b = steps(run), steps(old), steps(new)
    assert sorted(got) == list(range(1, 9))  # every step once
    assert all(got[s] == a[s] for s in range(1, 5))  # the old layout's records up to its checkpoint
    assert [got[s]["tokens"] for s in got] == [b[s]["tokens"] for s in b]  # the same global batches
    ids, ids_old, ids_new = (read_sample_log(d / "samples") for d in (tmp_path, old, new))
    assert sorted(ids) == [5, 6, 7, 8]  # the resumed run trained steps 5-8 only
    for s in range(5, 9):  # 8 sequences a step: the next global samples, none skipped or repeated
        assert len(ids[s]) == 8 and sorted(ids[s]) == sorted(ids_old[s]) == sorted(ids_new[s]), (case, s)
    for key in ("loss", "grad_norm"):  # the layouts' own relative difference, its largest over the run
        reorder = max(abs(a[s][key] - b[s][key]) / abs(b[s][key]) for s in b)
        for s in range(5, 9):
            bound = (4 * reorder + 4 * EPS32) * abs(b[s][key])
            assert abs(got[s][key] - b[s][key]) <= bound, (case, s, key, got[s], b[s], bound)
    w, w_old, w_new = (consolidate(r).state_dict for r in (run, old, new))
    reorder = max((w_old[k] - w_new[k]).abs().max().item() for k in w_new)
    scale = max(v.abs().max().item() for v in w_new.values())
    assert max((w[k] - w_new[k]).abs().max().item() for k in w_new) <= 4 * reorder + 4 * EPS32 * scale
    assert not (run / "checkpoints" / "universal").exists()  # the conversion went with the next save


def test_a_layout_deepspeed_cannot_convert_exits_2_on_every_rank(uninterrupted, dataset, tmp_path):
    """ZeRO-2 -> ZeRO-3 (DeepSpeed converts only between stages 1 and 2): exit 2 on both ranks before
    anything is loaded, naming both layouts and the way out; nothing written."""
    run = tmp_path / "run"
    shutil.copytree(uninterrupted(2, 2, 1), run, ignore=shutil.ignore_patterns("step_00000008", "wandb"))
    before = {p: p.read_bytes() for p in (run / "metrics.jsonl", run / "config.yaml")}
    out = tmp_path / "out.json"
    torchrun("tests.train.planted_save", 2, QUICKSTART, str(out), *COMMON, f"data.paths=[{dataset}]",
             f"log.run_dir={run}", *RUN, *layout(3, 1))
    got = [json.loads((tmp_path / f"out.json.rank{r}").read_text()) for r in (0, 1)]
    assert [g["status"] for g in got] == [2, 2] and "Traceback" not in got[0]["stderr"]
    assert ("was written at another layout (ZeRO-2, tp = 1, dp = 2 -> ZeRO-3, tp = 1, dp = 2) that cannot be "
            "converted: DeepSpeed converts between ZeRO-1 and ZeRO-2 only") in got[0]["stderr"], got[0]["stderr"]
    assert {p: p.read_bytes() for p in before} == before
    assert not (run / "checkpoints" / "universal").exists()
