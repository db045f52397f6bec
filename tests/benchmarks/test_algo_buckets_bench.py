"""benchmarks/algo_buckets.py's parts, without training (its arms are `rgpt algo train` runs, the
launcher the study and tests/train use): the recipe each arm gets is a valid config of the study's
parity runs at a fixed length range, a step's time is read from the run's log as its windows' tokens
over tokens/s (the first window left out), and a bad --models is refused before any run starts."""
import json

import pytest

from benchmarks.algo_buckets import main, recipe, step_time
from rgpt_dist.algorithmic.cli import task_config
from rgpt_dist.config import load_config


@pytest.mark.parametrize("extra", [["train.micro_batch_size=64"],
                                   ["train.micro_batch_size=64", "data.task_sort_by_length=true"]])
def test_each_arm_is_a_valid_config_at_a_fixed_range(extra):
    cfg = load_config(task_config("parity"), ["model=rlt-debug", *recipe(20, 0), *extra])
    assert (cfg.data.task_train_max, cfg.data.task_grow_by, cfg.train.max_steps) == (0, 0, 20)
    assert (cfg.train.global_batch_size, cfg.train.loss_norm, cfg.eval.every_steps) == (256, "example", 0)


def test_a_step_s_time_is_its_windows_tokens_over_their_rate(tmp_path):
    windows = [(5, 1000, 10.0), (10, 2000, 500.0), (15, 2600, 300.0)]  # (step, tokens so far, tokens/s)
    lines = [{"step": s, "tokens": t, "tokens_per_s": r, "loss": 1.0 / s} for s, t, r in windows]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    seconds, loss = step_time(tmp_path)
    assert seconds == pytest.approx((1000 / 500 + 600 / 300) / 10) and loss == pytest.approx(1 / 15)


def test_an_unknown_model_is_refused():
    with pytest.raises(SystemExit):
        main(["--models", "rlt3-2+2"])
