"""Every JSON file rgpt-eval writes is strict JSON: NaN / inf (a diverged loss, a stderr of one item)
are written as null, never as the bare NaN / Infinity tokens non-Python readers reject."""
import json

import numpy as np
import torch

from rgpt_dist import strict_json


def strict_load(text: str):
    def refuse(token):
        raise ValueError(f"non-strict JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_numbers_tensors_and_scalars_become_null_or_lists():
    value = {"a": float("nan"), "b": [float("inf"), -float("inf"), 1.5], "c": np.float32("nan"),
             "d": torch.tensor([1.0, float("nan")]), "e": np.array([[2, 3]]), "f": "NaN", "g": (1, None)}
    assert strict_load(strict_json.dumps(value)) == {"a": None, "b": [None, None, 1.5], "c": None,
                                                     "d": [1.0, None], "e": [[2, 3]], "f": "NaN", "g": [1, None]}


def test_lm_eval_results_and_samples_are_strict(tmp_path):
    from rgpt_dist.eval.harness import write_results
    run = {"model_dir": "m", "r_eval": 2, "tasks": {"t": {"acc": 0.5, "acc_stderr": float("nan"), "n": 1}},
           "samples": {"t": [{"doc_id": 0, "lls": [-float("inf"), -1.0]}]}}
    paths = write_results([run], tmp_path)
    assert strict_load(paths["json"].read_text())["runs"][0]["tasks"]["t"]["acc_stderr"] is None
    assert strict_load(paths["samples"][0].read_text().strip())["lls"] == [None, -1.0]


def test_threshold_exits_are_strict(tmp_path):
    from rgpt_dist.eval.learned_exit import write_threshold_exits
    rows = [{"threshold": 0.5, "loss": float("nan"), "mean_depth": 1.0, "flops_per_token": 1.0,
             "flops_vs_depth_R": 1.0, "tokens": 4, "train_depth": 2, "depth_fraction": [0.5, 0.5]}]
    paths = write_threshold_exits(rows, tmp_path)
    assert strict_load(next(p for p in paths if p.suffix == ".json").read_text())[0]["loss"] is None
