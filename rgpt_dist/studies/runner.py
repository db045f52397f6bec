"""`rgpt study NAME run|report|grid` for any study (base.Study): trains the runs not yet done, with
their records kept where the study (or --record) says, then writes the report. No torch import.
"""
from __future__ import annotations

import sys
from pathlib import Path

from rgpt_dist.config import load_config
from rgpt_dist.studies import records
from rgpt_dist.studies.base import Context, Run, Study, chosen
from rgpt_dist.studies.launch import ROOT, run_all


def run(study: Study, ctx: Context, *, only: str | None = None, record: Path | None = None) -> int:
    """Trains the study's runs (those matching `only`; with `record`, those not recorded there, cheapest
    first, each recorded as it finishes), writes the report over every run and prints it; exit status
    1 when a run failed (the others still run and are reported)."""
    runs = study.plan(ctx.preset)
    todo = chosen(runs, only)
    ctx.out.mkdir(parents=True, exist_ok=True)  # the report is written even when every run failed
    on_end = None
    if record is not None:
        if study.needs_data:  # a language model's record stands for its run on the same data and config
            try:
                todo = [run for run in _pending(study, runs, ctx, record) if run in todo]
            except records.RecordError as e:  # a damaged or hostile record, a link in --out: nothing trained
                print(f"rgpt study {study.name}: {e}", file=sys.stderr)
                return 2
        on_end = _recorder(study, ctx, record)
    failed = run_all(todo, lambda r: study.commands(r, ctx), ctx.jobs, log_dir=ctx.out, on_end=on_end)
    paths = study.report(ctx, runs)
    printed = not study.needs_data  # the task suites' table commands print their table and paths themselves
    if paths.get("md") is not None and paths["md"].is_file() and not printed:
        print(paths["md"].read_text())
    if record is not None:
        kept = [record / r.name for r in runs]
        print(f"the runs' wall time, summed over the machines that trained them: "
              f"{records.wall_seconds(kept) / 3600:.2f} h ({records.wall_seconds(kept, 'train_s') / 3600:.2f} h "
              "in training steps)")
    if not printed:
        print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 1 if failed else 0


def _pending(study: Study, runs: list[Run], ctx: Context, record: Path) -> list[Run]:
    """The runs not yet recorded, cheapest first by their configs' training FLOPs per token."""
    configs = {r.name: load_config(ROOT / r.config, [*study.overrides(r, ctx), *r.overrides]) for r in runs}
    todo = records.pending(runs, configs, record, ctx.out, ctx.data)
    return sorted(todo, key=lambda r: study.cost(r, ctx))


def _recorder(study: Study, ctx: Context, record: Path):
    """on_end of run_all: tally every launch of a run; record the run once it has succeeded."""
    def on_end(run: Run, wall_s: float, returncode: int) -> None:
        try:  # a link or FIFO planted in the run or record directory: said, and the other runs go on
            records.launch_ended(ctx.out / run.name, wall_s, returncode)
            if returncode == 0:
                records.save(ctx.out / run.name, record / run.name, data_dir=ctx.data, files=study.record_files(run))
        except records.RecordError as e:
            print(f"{run.name}: not recorded: {e}", file=sys.stderr, flush=True)
    return on_end
