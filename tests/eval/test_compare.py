"""The comparison's report (rgpt_dist/studies/compare/report.py; the runs and their training:
tests/studies/test_compare.py)."""
from rgpt_dist.studies.compare.report import markdown as compare_markdown


def test_compare_table_escapes_pipes_and_line_breaks_in_run_text():
    row = {"method": "Recurrent|GPT", "name": "run|a\n| b |", "layout": "1+1x2+1", "params": 1e6,
           "train_flops_per_token": 1e9, "tokens_seen": 10, "val_loss": 3.0, "delta_vs_dense": None,
           "early_exit_str": "4.000 3.000", "status": "finished\r"}
    lines = compare_markdown([row], {"runs": {"x|y": 3.0, "z": 3.1}, "mean": 3.05, "range": 0.1}).splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 3 and all(line.count("|") == 11 for line in table)
    assert "| Recurrent&#124;GPT | run&#124;a &#124; b &#124; |" in table[2]
    assert any("x&#124;y 3.0000" in line for line in lines)  # the seed-spread line too
