"""Every example command in README.md, docs/ and the commands' --help texts, dry-run: the files it
names under configs/, launcher/, benchmarks/, slurm/, data_prep/ and docker/ exist, every config it
names loads and validates, its `make` targets and `rgpt` verbs exist. (Running them is the business
of each command's own tests; this keeps the examples from going stale.)"""
import importlib
import re
from pathlib import Path

import pytest

from launcher.rgpt import VERBS
from tests.helpers.dist import ROOT

HELP_MODULES = ["launcher.rgpt", "launcher.train", "launcher.eval", "launcher.export", "launcher.flops",
                "launcher.compare", "launcher.ablation", "launcher.phi", "data_prep.cli",
                "rgpt_dist.algorithmic.cli", "rgpt_dist.thinking.cli"]
INPUTS = r"(?:configs|launcher|benchmarks|slurm|data_prep|docker)/[\w./-]+"


def _examples() -> list[tuple[str, str]]:
    """(where, command line) for every line of a bash block in the docs and of the commands' help."""
    out = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```(?:bash|sh)\n(.*?)```", page.read_text(), re.S):
            out += [(page.name, line) for line in block.splitlines() if line.strip()]
    for name in HELP_MODULES:
        doc = importlib.import_module(name).__doc__ or ""
        out += [(name, line.strip()) for line in doc.splitlines() if re.match(r"\s+(\S+/)?(rgpt|python|torchrun|deepspeed|sbatch|make)\b", line)]
    return out


EXAMPLES = _examples()


def test_there_are_examples_to_check():
    assert len(EXAMPLES) > 100 and {w for w, _ in EXAMPLES} >= {"README.md", "launcher.eval", "cluster.md"}


def test_every_file_an_example_names_exists():
    named = {(w, m.rstrip(".,;:)")) for w, line in EXAMPLES for m in re.findall(INPUTS, line.split(" #")[0])}
    missing = sorted((w, p) for w, p in named if not (ROOT / p).exists())
    assert not missing, missing


@pytest.mark.parametrize("config", sorted({m for _, line in EXAMPLES for m in re.findall(r"configs/[\w./-]+\.yaml", line)}))
def test_every_config_an_example_names_loads(config):
    from rgpt_dist.config import load_config

    load_config(ROOT / config)


def test_every_make_target_and_rgpt_verb_an_example_uses_exists():
    targets = set(re.search(r"^\.PHONY: (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split())
    used_targets = {m for _, line in EXAMPLES for m in re.findall(r"^\s*make ([a-z][\w-]*)", line)}
    used_verbs = {m for _, line in EXAMPLES for m in re.findall(r"(?:^|[\s/])rgpt ([a-z]+)\b", line)}
    assert used_targets and used_targets <= targets, used_targets - targets
    assert used_verbs and used_verbs <= set(VERBS), used_verbs - set(VERBS)
