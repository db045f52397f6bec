"""configs/algorithmic/<task>.yaml hold the RLT paper's recipe (section 3.1, J.1.1), field by field."""
import pytest

from rgpt_dist.config import FLAVOURS, load_config
from tests.helpers.dist import ROOT

# the longest training or validation sequence, BOS included, from the paper's framing (J.6): parity 40 bits,
# S5 32 operations, flat mod-5 39 expression tokens + '=', brackets 40 + '=', addition 8+8 digits:
# "[a] + [b] =" (10 + 3 + 10 + 2) + " [c]" with a 9-digit sum (12); EOS is a target, never read
SEQ_LEN = {"parity": 41, "s5_standard": 33, "s5_swaps": 33, "mod5_flat": 41, "mod5_brackets": 42,
           "addition": 1 + 25 + 12}


@pytest.mark.parametrize("task", sorted(SEQ_LEN))
def test_each_task_config_is_the_papers_recipe(task):
    cfg = load_config(ROOT / "configs" / "algorithmic" / f"{task}.yaml")
    t = cfg.train
    assert (t.lr, t.min_lr, t.warmup_steps, t.weight_decay, t.beta1, t.beta2, t.grad_clip) == (
        1e-4, 5e-6, 200, 0.1, 0.9, 0.95, 1.0)
    assert (t.global_batch_size, t.micro_batch_size, t.seed, t.loss_norm) == (512, 32, 42, "example")
    assert t.max_steps == (5000 if task.startswith("mod5") else 2000)
    assert t.seq_len == SEQ_LEN[task] and cfg.data.task == task
    assert (cfg.parallel.dtype, cfg.eval.every_steps, cfg.checkpoint.every_steps, cfg.checkpoint.keep_best) == (
        "fp32", 100, 100, True)
    assert cfg.model.to_dict() == load_config("rlt-transformer-8").model.to_dict() and "rlt-transformer-8" in FLAVOURS
