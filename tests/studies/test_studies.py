"""The studies behind `rgpt study` (rgpt_dist/studies/): each one's plan, commands and grid through the
one Study protocol, and the command's refusals. The CPU-scale recipes of `rlt`, `algorithmic` and
`thinking` are checked against the commands the Makefile ran before they became studies (written
out here), so that `make rlt` still trains what docs/families.md reports."""
import shlex
import sys
from pathlib import Path

import pytest

from launcher.study import main as study_main
from rgpt_dist.models.flavours import FLAVOURS
from rgpt_dist.studies import NAMES, study
from rgpt_dist.studies.base import Context


def test_list_names_every_study_and_help_leads_with_examples(capsys):
    assert study_main(["list"]) == 0
    said = capsys.readouterr().out
    lines = said.splitlines()
    assert [line.split()[0] for line in lines[::2]] == list(NAMES)
    assert all(line.split()[0] == "reproduces:" for line in lines[1::2])
    with pytest.raises(SystemExit):
        study_main(["--help"])
    text = capsys.readouterr().out
    assert text.index("rgpt study compare run --data") < text.index("positional arguments")


@pytest.mark.parametrize("name", NAMES)
def test_every_plan_has_unique_runs_whose_family_is_their_flavours(name, tmp_path):
    s = study(name)
    ctx = Context(out=tmp_path, data=str(tmp_path / "data"), preset=s.presets[0], nproc=s.default_nproc)
    runs = s.plan(ctx.preset)
    assert runs and len({r.name for r in runs}) == len(runs)
    for run in runs:
        if run.model in FLAVOURS:
            assert run.family == FLAVOURS[run.model]["family"]
        assert (Path(__file__).parents[2] / run.config).is_file()
        commands = s.commands(run, ctx)
        assert commands and all(isinstance(w, str) for c in commands for w in c)
        assert not any(w.endswith(".py") for c in commands for w in c)  # modules, never script paths
        assert any(str(tmp_path / run.name) in " ".join(c) for c in commands)  # into OUT/<run>


def _words(command: list[str]) -> str:
    """The command after the interpreter, as a string."""
    assert command[0] == sys.executable
    return shlex.join(command[1:])


def test_rlt_trains_and_scores_what_the_makefile_did(tmp_path):
    """Parity, one process per run, the CPU recipe's overrides (900 steps: 450 left seed 43 short of its
    transition; the length curriculum from 3-16 bits to the paper's 3-40), three seeds, then the last
    checkpoint's evaluation on the first 256 test sequences per length; then swaps-S5 alike (600 steps,
    its curriculum from 1-8 operations to the paper's 32)."""
    cpu = ("data.task_train_max=16 data.task_grow_by=8 data.task_grow_steps=100 train.max_steps=900 train.global_batch_size=256 train.micro_batch_size=256 "
           "train.warmup_steps=40 train.lr=1e-3 train.min_lr=5e-5 eval.every_steps=900 checkpoint.every_steps=900 "
           "checkpoint.keep_best=false log.wandb=disabled model.mup_base_width=128").split()
    s5 = ("data.task_train_max=8 data.task_grow_by=8 data.task_grow_steps=10 data.task_grow_loss=0.05 "
          "train.max_steps=600 train.global_batch_size=256 train.micro_batch_size=256 train.warmup_steps=40 "
          "train.lr=1e-3 train.min_lr=5e-5 eval.every_steps=600 checkpoint.every_steps=600 checkpoint.keep_best=false "
          "log.wandb=disabled model.mup_base_width=128").split()
    models = {"rlt1-2+2": ("rlt-debug", []), "rlt0-2+2": ("rlt-debug", ["model.feedback_interval=0"]),
              "transformer-4": ("rlt-transformer-debug", [])}
    recipes = {"parity": cpu, "s5_swaps": s5}
    s = study("rlt")
    runs = s.plan("cpu")
    assert [r.name for r in runs] == [f"{t}-{n}-s{seed}" for t in recipes for n in models for seed in (42, 43, 44)]
    for run in runs:
        task, label = run.name.rsplit("-s", 1)[0].split("-", 1)
        flavour, extra = models[label]
        out = tmp_path / run.name
        train, evaluate = s.commands(run, Context(out=tmp_path))
        assert sorted(shlex.split(_words(train))) == sorted(
            ["-m", "launcher.algo", "train", task, "--model", flavour, "--seed", str(run.seed), "--out", str(out),
             "--nproc", "1", *recipes[task], *extra])
        assert _words(evaluate) == f"-m launcher.algo eval {out} --checkpoint last --limit 256"
    assert s.record_files(runs[0]) == ("config.yaml", "metrics.jsonl", "eval-last/eval.json")


def test_algorithmic_and_thinking_train_what_the_makefile_did(tmp_path):
    algo = ("train.max_steps=400 train.global_batch_size=64 train.micro_batch_size=32 train.warmup_steps=40 "
            "train.lr=1e-3 train.min_lr=5e-5 eval.every_steps=50 checkpoint.every_steps=50 log.wandb=disabled").split()
    runs = study("algorithmic").plan("cpu")
    assert sorted(r.name for r in runs) == sorted(f"{t}-rlt-transformer-debug-s{s}" for t in ("parity", "s5_swaps")
                                                  for s in (42, 43, 44))
    for run in runs:
        train, evaluate = study("algorithmic").commands(run, Context(out=tmp_path))
        task = run.name.split("-rlt")[0]
        assert sorted(train[1:]) == sorted(["-m", "launcher.algo", "train", task, "--model", "rlt-transformer-debug",
                                            "--seed", str(run.seed), "--out", str(tmp_path / run.name), "--nproc", "1",
                                            *algo])
        assert evaluate[1:] == ["-m", "launcher.algo", "eval", str(tmp_path / run.name), "--checkpoint", "best",
                                "--limit", "256"]
    think = "train.max_steps=3000 eval.every_steps=500 checkpoint.every_steps=500 log.wandb=disabled".split()
    for run in study("thinking").plan("cpu"):
        train, frontier = study("thinking").commands(run, Context(out=tmp_path))
        assert train[1:] == ["-m", "launcher.think", "train", "graph", "--model", "thinking-graph-debug", "--seed",
                             str(run.seed), "--out", str(tmp_path / run.name), *think]
        assert frontier[1:] == ["-m", "launcher.think", "frontier", str(tmp_path / run.name)]


@pytest.mark.parametrize("args,message", [
    (["compare", "run", "--data", "nowhere"], "is not an rgpt-prep dataset"),
    (["compare"], "give an action"),
    (["phi", "run", "--preset", "long"], "is not one of its presets"),
    (["rlt", "run", "--jobs", "0"], "must be >= 1"),
    (["rlt", "run", "--only", "nope-*"], "matches none"),
])
def test_bad_arguments_are_refused_before_anything_runs(args, message, tmp_path, capsys):
    assert study_main([*args, "--out", str(tmp_path / "out")]) == 2
    assert message in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_grid_writes_what_is_committed(tmp_path):
    """`rgpt study NAME grid` into a scratch checkout writes byte for byte the committed grid files."""
    root = Path(__file__).parents[2]
    for name in ("compare", "ablation", "phi", "rt-compare"):
        for path in study(name).grid(tmp_path):
            rel = path.relative_to(tmp_path)
            assert path.read_bytes() == (root / rel).read_bytes(), f"{rel} is stale: run rgpt study {name} grid"
