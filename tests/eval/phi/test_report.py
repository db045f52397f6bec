"""The phi report (issue #26): phi.json (strict JSON, the fits' numbers exactly), phi.md (the table, the
intervals and the sentence reading phi) and phi.png, from fits of synthetic runs on the law."""
import json
import math
import struct
from dataclasses import asdict, replace

import numpy as np
import pytest

from rgpt_dist.eval.phi.fit import bootstrap, fit_law
from rgpt_dist.eval.phi.report import write_report
from tests.eval.phi.test_fit import TRUE, law, observations, paper_grid


def _strict(text: str):
    def refuse(token):
        raise ValueError(f"non-strict JSON token {token}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def fitted():
    """The paper grid's losses on the law with 0.4% noise on log L; the three fits (20 starts each: the
    report, not the fit, is under test) and a 10-resample bootstrap of the free one."""
    grid = paper_grid()
    rng = np.random.default_rng(0)
    obs = observations(grid, law(grid, TRUE) * np.exp(0.004 * rng.standard_normal(len(grid))))
    fits = {"phi free": fit_law(obs, restarts=20), "phi = 0": fit_law(obs, phi=0.0, restarts=20),
            "phi = 1": fit_law(obs, phi=1.0, restarts=20)}
    boot = bootstrap(obs, fit=fits["phi free"], samples=10, refit_restarts=1)
    return obs, fits, {"phi free": boot.intervals}


@pytest.fixture(scope="module")
def report(fitted, tmp_path_factory):
    obs, fits, intervals = fitted
    out = tmp_path_factory.mktemp("phi") / "report"
    return write_report(obs, fits, intervals, out), out


def test_files_are_written(report):
    paths, out = report
    assert {p.name for p in out.iterdir()} == {"phi.json", "phi.md", "phi.png"}
    assert set(paths.values()) == {out / "phi.json", out / "phi.md", out / "phi.png"}


def test_json_is_strict_and_holds_the_fits(report, fitted):
    paths, _ = report
    obs, fits, intervals = fitted
    data = _strict(paths["json"].read_text())
    assert data["fits"] == {name: fit.to_dict() for name, fit in fits.items()}  # every float exactly
    assert data["r2"] == {name: fit.r2 for name, fit in fits.items()}
    assert data["intervals"] == {"phi free": {k: list(v) for k, v in intervals["phi free"].items()}}
    assert data["observations"] == [asdict(o) for o in obs]
    assert data["level"] == 0.95 and "log L" in data["r2_definition"]


def test_markdown_table(report, fitted):
    paths, _ = report
    _, fits, intervals = fitted
    text = paths["md"].read_text()
    lo, hi = intervals["phi free"]["phi"]
    free = fits["phi free"]
    assert "| fit | phi [95% CI] | alpha | beta | E | A | B | R^2 | n |" in text
    assert (f"| phi free | {free.phi:.3f} [{lo:.3f}, {hi:.3f}] | {free.alpha:.3f} | {free.beta:.3f} | {free.E:.3f} | "
            f"{free.A:.4g} | {free.B:.4g} | {free.r2:.4f} | 116 |") in text
    one = fits["phi = 1"]
    assert f"| phi = 1 | 1.000 (fixed) | {one.alpha:.3f} |" in text
    assert f"phi = {free.phi:.3f} means one recurrence is worth" in text
    assert f"r = 4: {4 ** free.phi:.2f}" in text and f"r = 8: {8 ** free.phi:.2f}" in text
    assert "116 runs in 24 (budget, r) cells" in text


def test_plot_is_a_png_with_one_panel_per_fit(report):
    paths, _ = report
    head = paths["png"].read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert (width, height) == (round(3 * 4.5 * 110), round(4 * 110))  # three 4.5 x 4 in panels at 110 dpi


def test_non_finite_values_are_null_and_names_are_escaped(fitted, tmp_path):
    obs, fits, _ = fitted
    odd = {"a | b": replace(fits["phi free"], r2=math.nan)}
    paths = write_report(obs, odd, {}, tmp_path)
    data = _strict(paths["json"].read_text())
    assert data["r2"] == {"a | b": None} and data["fits"]["a | b"]["r2"] is None
    assert "| a &#124; b |" in paths["md"].read_text()


def test_inconsistent_inputs_are_refused(fitted, tmp_path):
    obs, fits, intervals = fitted
    with pytest.raises(ValueError, match="no fits"):
        write_report(obs, {}, {}, tmp_path)
    with pytest.raises(ValueError, match="intervals for fits that are not reported: other"):
        write_report(obs, fits, {"other": intervals["phi free"]}, tmp_path)
    with pytest.raises(ValueError, match="n_obs = 116, the report has 115 observations"):
        write_report(obs[:115], fits, intervals, tmp_path)
    assert not any(tmp_path.iterdir())
