"""rgpt_dist.run_files: the one reader of a run's JSON and YAML files (regular files only, bounded
size and nesting, aliases capped, strict JSON) and its typed field checks, each refusal naming the
file and the field."""
import os

import pytest

from rgpt_dist.run_files import MAX_DEPTH, RunFileError, read_json, read_mapping, read_yaml
from tests.helpers.fifo import no_block

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))


def test_a_fifo_a_link_and_a_huge_file_are_refused_without_blocking(tmp_path):
    fifo, link, huge = tmp_path / "fifo.json", tmp_path / "link.json", tmp_path / "huge.json"
    os.mkfifo(fifo)
    link.symlink_to(tmp_path / "elsewhere.json")
    (tmp_path / "elsewhere.json").write_text("{}")
    huge.write_bytes(b" " * 2048 + b"{}")
    with pytest.raises(RunFileError, match="FIFO"):
        no_block(lambda: read_json(fifo), fifo)
    with pytest.raises(RunFileError, match="symbolic link"):
        read_json(link)
    with pytest.raises(RunFileError, match="huge.json is larger than 1,024 bytes"):
        read_json(huge, limit=1024)


def test_json_without_nan_and_nested_at_most_max_depth(tmp_path):
    (tmp_path / "nan.json").write_text('{"loss": NaN}')
    with pytest.raises(RunFileError, match="nan.json is not valid JSON: NaN"):
        read_json(tmp_path / "nan.json")
    (tmp_path / "deep.json").write_text("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    with pytest.raises(RunFileError, match="nested more than"):
        read_json(tmp_path / "deep.json")
    (tmp_path / "ok.json").write_text("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    assert read_json(tmp_path / "ok.json") is not None


def test_a_yaml_alias_bomb_is_refused(tmp_path):
    (tmp_path / "config.yaml").write_text(BOMB)
    with pytest.raises(RunFileError, match="config.yaml is not valid YAML"):
        read_yaml(tmp_path / "config.yaml")


def test_fields_name_the_file_and_the_field(tmp_path):
    (tmp_path / "r.json").write_text('{"seed": "42", "n": 5, "x": 1e308, "sub": {"k": true}, "xs": [1, "a"]}')
    f = read_mapping(tmp_path / "r.json")
    with pytest.raises(RunFileError, match=r"r.json: seed must be an integer, not str"):
        f.int("seed")
    with pytest.raises(RunFileError, match=r"r.json: n = 5 is outside 0..3"):
        f.int("n", lo=0, hi=3)
    with pytest.raises(RunFileError, match=r"r.json: x = 1e\+308 is not a finite number in \[0.0, 1.0\]"):
        f.number("x", lo=0.0, hi=1.0)
    with pytest.raises(RunFileError, match=r"r.json: sub.k must be a number, not bool"):
        f.mapping("sub").number("k")
    with pytest.raises(RunFileError, match=r"r.json: xs must be a list of integers"):
        f.list("xs", lambda v: isinstance(v, int), "integers")
    with pytest.raises(RunFileError, match=r"r.json: absent is missing"):
        f.str("absent")
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(RunFileError, match="list.json must hold a mapping, not list"):
        read_mapping(tmp_path / "list.json")
