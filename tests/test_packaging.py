"""pyproject.toml's package data names files that exist: a renamed folder (hf_recurrent/ ->
hf_looped/) must not silently drop the model code every Hugging Face export ships from a wheel."""
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_data_pattern_matches_files():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = project["tool"]["setuptools"]["package-data"]
    assert "rgpt_dist.export" in data
    for package, patterns in data.items():
        base = ROOT.joinpath(*package.split("."))
        for pattern in patterns:
            assert sorted(base.glob(pattern)), f"package-data {package}: {pattern!r} matches no file under {base}"


def test_the_shipped_hf_code_is_package_data():
    """The writer copies every .py of hf_looped/ into an export; each must be covered by a pattern."""
    from rgpt_dist.export.hf_looped_writer import HF_CODE_DIR

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    base = ROOT / "rgpt_dist" / "export"
    covered = {p for pattern in project["tool"]["setuptools"]["package-data"]["rgpt_dist.export"]
               for p in base.glob(pattern)}
    assert sorted(HF_CODE_DIR.glob("*.py")) and set(HF_CODE_DIR.glob("*.py")) <= covered
