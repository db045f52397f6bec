"""Paths our own launchers turn into key=value overrides reach the config literally
(rgpt_dist.sections.literal_override): a `#` (YAML's comment), a `,` (a flow-list separator), spaces,
quotes and `$` in `rgpt algo|think train --out`, a study's `--out` / `--data` and the SLURM run root
(tests/slurm/test_scripts.py) never cut a path short or split one into two."""
import pytest

from rgpt_dist.algorithmic.cli import parse, task_config, train_overrides
from rgpt_dist.config import load_config
from rgpt_dist.sections import literal_override, parse_override
from rgpt_dist.studies.base import Context, Run
from rgpt_dist.studies.launch import cpu_overrides
from rgpt_dist.studies.phi import PHI

HOSTILE = ["runs/exp #2", "a,b", "x y/'q' \"d\"", "$HOME/${X}", "[not, a list]", "- dash", "null", "0x10", "ü/ß"]


@pytest.mark.parametrize("value", HOSTILE)
def test_a_literal_override_reads_back_unchanged(value):
    assert parse_override(literal_override("log.run_dir", value)) == (["log", "run_dir"], value)
    assert parse_override(literal_override("data.paths", [value, value + "2"]))[1] == [value, value + "2"]


def test_algo_train_out_is_the_run_directory(tmp_path):
    out = str(tmp_path / "exp #2, a $b")
    args = parse(["train", "parity", "--model", "rlt-transformer-debug", "--seed", "42", "--out", out])
    cfg = load_config(task_config("parity"), train_overrides(args))
    assert cfg.log.run_dir == out and cfg.log.name == "exp #2, a $b"


def test_a_studys_out_and_data_are_one_path_each(tmp_path):
    data, out = str(tmp_path / "data #1,x"), tmp_path / "out 'q' $y"
    cfg = load_config("configs/experiments/quickstart.yaml",
                      cpu_overrides("cpu", "recurrent_gpt", 42, data, out / "run"))
    assert cfg.data.paths == [data] and cfg.log.run_dir == str(out / "run")
    run = PHI.plan("cpu")[0]
    given = [parse_override(o) for o in PHI.overrides(run, Context(out=out, data=data, preset="cpu", nproc=1, jobs=1))]
    phi = {".".join(keys): value for keys, value in given}
    assert phi["data.paths"] == [data] and phi["log.run_dir"] == str(out / run.name)
