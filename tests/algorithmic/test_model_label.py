"""rgpt_dist.algorithmic.evaluate.model_label: a run's name in the tables names the model fields its
command line changed, so two runs of one flavour with different models never share a column."""
from __future__ import annotations

import json

from rgpt_dist.algorithmic.evaluate import RUN_RECORD, model_label


def _label(tmp_path, overrides):
    (tmp_path / RUN_RECORD).write_text(json.dumps({"task": "parity", "model": "rlt-debug", "seed": 42,
                                                   "overrides": overrides}))
    return model_label(tmp_path, {"model": {"family": "rlt"}})[0]


def test_model_overrides_are_named_in_order(tmp_path):
    base = ["model=rlt-debug", "train.seed=42", "log.run_dir=x"]
    assert _label(tmp_path, base + ["train.lr=1e-3"]) == "rlt-debug"
    assert _label(tmp_path, base + ["model.n_enc=3", "train.lr=1", "model.n_dec=1"]) == "rlt-debug n_enc=3 n_dec=1"
    assert _label(tmp_path, base + ["model.flavour=rlt-debug", "model.window=4"]) == "rlt-debug window=4"


def test_a_run_without_a_record_is_named_by_family_and_depth(tmp_path):
    assert model_label(tmp_path, {"model": {"family": "gpt2", "n_layer": 4}}) == ("gpt2-4L", {})
