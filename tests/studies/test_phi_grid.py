"""The looped scaling law's iso-depth sweep configs (rgpt_dist/studies/phi/grid.py, issue #26, SPEC
section 10): the files on disk are the generator's, every run has the iso-depth layout at a fixed
depth, its parameter split is SPEC's formula, and its max_steps reach the named budget. (Every
phi-*.yaml also loads, validates and passes preflight in tests/studies/test_compare_grid.py.)"""
import fnmatch
import math
import re
from pathlib import Path

import pytest
import yaml

from rgpt_dist.studies.phi.grid import (BUDGETS, STUDIES, all_configs, baseline_runs, group_patterns, model_config,
                                        model_section, runs, study_runs)
from rgpt_dist.flops import param_count, param_split, train_flops
from rgpt_dist.models.spec import spec_for

EXPERIMENTS = Path(__file__).resolve().parents[2] / "configs" / "experiments" / "phi"
NAME = re.compile(r"^phi-(rgpt|plain|trunc|nogate)-r(\d+)-d(\d+)-c(\S+)$")
TOKENS_PER_STEP = 480 * 1024  # the recipe's; test_experiments checks every file has it


@pytest.fixture(scope="module")
def on_disk():
    """name -> (the YAML's mapping, its typed model config, (study, r, width, budget) from the name)."""
    out = {}
    for path in sorted(EXPERIMENTS.glob("phi-*.yaml")):
        data = yaml.safe_load(path.read_text())
        study, r, d, c = NAME.match(path.stem).groups()
        out[path.stem] = (data, model_config(data["model"]), (study, int(r), int(d), c))
    return out


def test_files_on_disk_equal_the_generator(on_disk):
    configs = all_configs()
    assert set(on_disk) == set(configs)
    for name, data in configs.items():
        assert on_disk[name][0] == data, name


def test_every_run_is_the_iso_depth_layout_at_a_fixed_depth(on_disk):
    for name, (data, cfg, (study, r, d, c)) in on_disk.items():
        assert r in (1, 2, 4, 8) and (cfg.n_pre, cfg.n_rec, cfg.n_loops, cfg.n_coda) == (2, 16 // r, r, 2), name
        assert d % 128 == 0 and cfg.d_model == d and cfg.d_model // cfg.n_head == 64, name
        spec = spec_for(cfg)
        assert spec.depth_sampler(cfg).pmf() == {r: 1.0}, name
        assert data["log"]["run_dir"] == f"runs/{name}"
        if study in ("rgpt", "nogate"):
            assert cfg.family == "recurrent_gpt" and cfg.injection == "concat", name
            assert cfg.gate == ("learned" if study == "rgpt" else "none"), name
        else:
            assert cfg.family == "poisson", name
            k = r if study == "plain" else math.ceil(r / 2)
            assert cfg.k_max == k and spec.grad_steps(cfg, r) == k, name  # plain: full backprop


def test_parameter_split_is_specs_formula(on_disk):
    """SPEC section 10: N_once = 48 d^2, N_rec = (192 / r + 2) d^2 up to biases and norms, which are
    asserted exactly: 4 GPT-2 blocks (13 d each) + the final LayerNorm (2 d) once; the core's
    16 / r blocks (13 d each) recur; RecurrentGPT adds its gate, 3 d^2 + 2 d, and the gate's two
    LayerNorms, 4 d, to N_rec (the 2 d^2 of every study is W_proj / the adapter)."""
    for name, (_, cfg, (study, r, d, _)) in on_disk.items():
        n_once, n_rec = param_split(cfg)
        assert n_once == 48 * d * d + 4 * 13 * d + 2 * d, name
        gate = 3 * d * d + 2 * d + 4 * d if study == "rgpt" else 0
        assert n_rec == (192 // r + 2) * d * d + (16 // r) * 13 * d + gate, name


def test_max_steps_reach_the_named_budget(on_disk):
    """Training FLOPs (3 x Eq. 1 forward with the head, at seq_len 1024, x tokens) of max_steps are
    within 0.1% of the name's budget (rounding to whole steps: >= 669 steps, at most 0.075%)."""
    worst = 0.0
    for name, (data, cfg, (_, _, _, c)) in on_disk.items():
        assert float(c) == BUDGETS[c]
        achieved = train_flops(cfg, 1024) * TOKENS_PER_STEP * data["train"]["max_steps"]
        worst = max(worst, abs(achieved / float(c) - 1))
        assert data["train"]["warmup_steps"] == min(2000, data["train"]["max_steps"] // 10)
    assert worst < 1e-3


def test_counts_widths_and_tokens_per_parameter(on_disk):
    """Five widths per budget, the same in every study; each r = 1 rgpt model sees 2 to 150 tokens
    per non-embedding parameter; 120 runs per full study, the case studies at the lowest four
    budgets (trunc without r = 1: plain's runs are its)."""
    cells = {}
    for name, (data, cfg, (study, r, d, c)) in on_disk.items():
        cells.setdefault(study, {}).setdefault(c, set()).add(d)
        if study == "rgpt" and r == 1:
            tpp = data["train"]["max_steps"] * TOKENS_PER_STEP / param_count(cfg, embeddings=False)
            assert 2 <= tpp <= 150, (name, tpp)
    lowest_four = sorted(BUDGETS, key=BUDGETS.get)[:4]
    for study, per_budget in cells.items():
        assert sorted(per_budget) == sorted(BUDGETS if study in ("rgpt", "plain") else lowest_four)
        assert all(per_budget[c] == cells["rgpt"][c] and len(per_budget[c]) == 5 for c in per_budget)
    counts = {study: sum(s == study for (_, _, (s, _, _, _)) in on_disk.values()) for study in STUDIES}
    assert counts == {"rgpt": 120, "plain": 120, "trunc": 60, "nogate": 80}


def test_case_studies_name_their_runs_and_baselines():
    trunc = study_runs("trunc")
    reused = [n for n in trunc if n.startswith("phi-plain-")]
    assert len(trunc) == 80 and len(reused) == 20 and all("-r1-" in n for n in reused)
    for name in reused:  # plain's r = 1 run is the trunc study's: k_max = ceil(1 / 2) = 1 = r
        _, r, d, _ = NAME.match(name).groups()
        assert model_section("trunc", 1, int(d)) == model_section("plain", 1, int(d))
    assert set(baseline_runs("trunc")) == {n for n in study_runs("plain") if NAME.match(n).group(4) in
                                           {NAME.match(t).group(4) for t in trunc}}
    assert len(baseline_runs("nogate")) == 80 and all(n.startswith("phi-rgpt-") for n in baseline_runs("nogate"))
    assert study_runs("rgpt") == [run.name for run in runs("rgpt")]
    with pytest.raises(ValueError, match="phi study 'rgpt' is not a case study"):
        baseline_runs("rgpt")
    with pytest.raises(ValueError, match="unknown phi study 'bogus'"):
        runs("bogus")


def test_group_patterns_select_exactly_each_studys_runs():
    """rgpt-eval phi --group takes glob patterns: over every generated name, each study's patterns
    match its study_runs and a case study's baseline patterns its baseline_runs, nothing else."""
    names = [run.name for run in runs()]

    def matched(patterns):
        return sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns))
    for study in STUDIES:
        assert matched(group_patterns(study)) == sorted(study_runs(study)), study
    for study in ("trunc", "nogate"):
        assert matched(group_patterns(study, baseline=True)) == sorted(baseline_runs(study)), study
    assert group_patterns("trunc") == ["phi-trunc-*", "phi-plain-r1-*-c4.64e17", "phi-plain-r1-*-c1e18",
                                       "phi-plain-r1-*-c2.15e18", "phi-plain-r1-*-c4.64e18"]
