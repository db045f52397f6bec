"""`make help` (and plain `make`) lists every target of the Makefile once, each with its line."""
import re
import subprocess

from tests.helpers.dist import ROOT


def test_make_help_lists_every_target_once():
    phony = re.search(r"^\.PHONY: (.*)$", (ROOT / "Makefile").read_text(), re.M).group(1).split()
    for command in (["make", "-s", "help"], ["make", "-s"]):
        out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=True, timeout=60).stdout
        listed = [line.split()[1] for line in out.splitlines()]
        assert sorted(listed) == sorted(phony), out
        assert all(len(line.split(maxsplit=2)) == 3 for line in out.splitlines()), out  # a line each
