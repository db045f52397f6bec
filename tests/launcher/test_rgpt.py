"""`rgpt VERB` (launcher/rgpt.py): the help lists every verb, each verb reaches its command's own help,
`rgpt train` validates before it launches and prints the command it runs (and runs it), and the
former `rgpt-*` names still work, with a notice."""
import json
import os
import shlex
import subprocess
import sys

import pytest

from launcher import rgpt
from tests.helpers.dist import ROOT
from tests.helpers.runs import COMMON, QUICKSTART


def test_the_help_lists_every_verb_with_examples(capsys):
    with pytest.raises(SystemExit) as done:
        rgpt.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert all(f"  {verb}" in out and f"rgpt {verb} " in out for verb in rgpt.VERBS), out


@pytest.mark.parametrize("verb", list(rgpt.VERBS))
def test_each_verb_prints_its_own_help(verb, capsys):
    try:
        code = rgpt.main([verb, "--help"])
    except SystemExit as e:  # argparse's help
        code = e.code
    out = capsys.readouterr().out
    assert code in (0, None) and len(out.splitlines()) > 3, out


def test_train_refuses_a_bad_config_before_launching(capsys):
    assert rgpt.main(["train", QUICKSTART, "train.max_steps=-1", "model.n_loops=0"]) == 2
    err = capsys.readouterr()
    assert "train.max_steps=-1" in err.err and "model.n_loops=0" in err.err and "torch.distributed.run" not in err.out


def test_train_prints_the_command_it_runs(capsys):
    assert rgpt.main(["train", QUICKSTART, "train.seed=3", "--nproc", "2", "--dry-run"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.endswith(f"-m torch.distributed.run --standalone --nproc_per_node=2 -m launcher.train {QUICKSTART} "
                         "train.seed=3"), line
    assert rgpt.main(["train", QUICKSTART, "--nproc", "2", "--launcher", "deepspeed", "--dry-run"]) == 0
    assert "deepspeed.launcher.runner --num_gpus 2 " in capsys.readouterr().out


def test_train_runs_what_it_printed(dataset, tmp_path):
    run = tmp_path / "run"
    args = [QUICKSTART, *COMMON, f"data.paths=[{dataset}]", f"log.run_dir={run}", "train.max_steps=2",
            "eval.every_steps=0", "checkpoint.every_steps=2", "parallel.zero_stage=0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT),
           "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(ROOT / ".venv" / "torch_extensions"))}
    done = subprocess.run([sys.executable, "-m", "launcher.rgpt", "train", *args, "--nproc", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.splitlines()[0].endswith(shlex.join(args))
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 2 and (run / "checkpoints" / "latest").read_text() == "step_00000002"


def test_the_former_names_still_work_and_say_so(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["rgpt-flops", "recurrentgpt-debug", "--json"])
    assert rgpt.legacy_flops() == 0
    out = capsys.readouterr()
    assert "rgpt-flops: this name is deprecated" in out.err and "use `rgpt flops`" in out.err
    assert json.loads(out.out)
