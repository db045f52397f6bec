"""The training loop: steps, accumulation, evaluation and checkpoint cadence, resumption.

Families differ only through what they return: the model's depth sampler (None for dense models),
`ModelOutput.loss`, and `aux` (an optional `aux_loss` is added to the loss; the per-step statistics in
`aux['stats']` and exit losses are logged when present; an evaluation forward's `aux['eval_metrics']`,
{name: scalar tensor}, is averaged over the batches and ranks into the eval record). No branch here
names a family.
With checkpoint.keep_best, each evaluation that `improves` on the best validation loss so far is
saved and named in best.json (CheckpointManager.save(best=...)); the best so far rides in the client
state, so a resumed run continues the same selection.
"""
from __future__ import annotations

import dataclasses
import math
import os
import time
from typing import Any, Iterator

import torch
import torch.distributed as dist

from rgpt_dist.config.experiment import Config
from rgpt_dist.depth import step_depths
from rgpt_dist.models.spec import spec_for
from rgpt_dist.noise import NoiseKey
from rgpt_dist.parallel.compile import compile_stats
from rgpt_dist.parallel.dims import ParallelDims
from rgpt_dist.parallel.reshard import layout_for
from rgpt_dist.parallel.universal import KEY as UNIVERSAL, layout_change, universal_info
from rgpt_dist.parallel.zero import trainer_clips
from rgpt_dist.train.checkpoint import CheckpointManager
from rgpt_dist.train.metrics import MetricsSink, peak_flops, step_flops
from rgpt_dist.train.optim import apply_config, clip_gradients, global_grad_norm
from rgpt_dist.train.preemption import StopRequested
from rgpt_dist.train.sample_log import SampleLog


class NonFiniteError(RuntimeError):
    """Too many consecutive optimizer steps had non-finite gradients."""


class DifferentRun(ValueError):
    """The checkpoint to resume from was written by a run with another model, seed or precision
    (Trainer._check_same_run), or at a layout that does not convert (Trainer._layout_change):
    nothing was loaded."""


def _injected_nan(step: int, rank: int, var: str = "RGPT_INJECT_NAN") -> bool:
    """Fault injection for tests: RGPT_INJECT_NAN="STEP[,STEP...][@RANK]" makes that rank's loss
    NaN at those (0-based) optimizer steps; RGPT_INJECT_GRAD_NAN (same syntax) instead puts one NaN
    into that rank's gradient after the reduction over ranks, where only the optimizer's own
    agreement can make the other ranks skip too (Trainer._inject_reduced_nan)."""
    spec = os.environ.get(var)
    if not spec:
        return False
    steps, _, only = spec.partition("@")
    return step in {int(s) for s in steps.split(",")} and (not only or int(only) == rank)


def _comm_device() -> torch.device:
    """Where small collective tensors live: the current GPU under NCCL, the CPU under gloo."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _mean_across_ranks(values: list[float]) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(t)
    return (t / dist.get_world_size()).tolist()


class Trainer:
    def __init__(self, cfg: Config, dims: ParallelDims, engine, optimizer, train_loader, val_batches: list,
                 ckpt: CheckpointManager, sink: MetricsSink, stop: StopRequested | None = None):
        self.cfg, self.dims, self.engine, self.optimizer = cfg, dims, engine, optimizer
        self.stop = stop
        self.consecutive_nonfinite = 0
        self.model = engine.module
        self.sampler = spec_for(cfg.model).depth_sampler(cfg.model)
        self.train_loader, self.val_batches = train_loader, val_batches
        self.ckpt, self.sink = ckpt, sink
        self.accum = cfg.train.grad_accum_steps(dims.dp)
        self.step, self.tokens = 0, 0
        self.peak, self.peak_source = peak_flops(cfg.parallel.dtype)
        self.compiled = cfg.parallel.compile_mode() != "none"
        # ZeRO-0 without DeepSpeed's bf16 optimizer: the trainer computes the norm and clips (own_norm)
        self.own_norm = trainer_clips(cfg)
        self._data: Iterator | None = None
        # RGPT_SAMPLE_LOG: the data stream's audit trail, from one rank per replica (tp peers read the same samples)
        self.sample_log = SampleLog.from_env(dims.rank) if dims.rank % dims.tp == 0 else None
        self.best: dict[str, Any] | None = None  # checkpoint.keep_best: {"step", "val_loss"} of the best evaluation
        self._universal: dict | None = None  # client_state's tp slicing, made once

    # ---- data -------------------------------------------------------------------------------
    def widths(self, step: int) -> list[int]:
        """The padded widths of step `step`'s equal parts of the global batch, which tokens and FLOPs
        count: [train.seq_len] for token shards; a task loader's (less where it pads to its own
        longest: a capped stream, data.task_train_max, widened by a length curriculum; one per
        micro-batch with length buckets, data.task_sort_by_length). Asked before the curriculum grows."""
        widths = getattr(self.train_loader, "widths", None)
        return [self.cfg.train.seq_len] if widths is None else widths(step)

    def _batches(self) -> Iterator:
        """Training micro-batches forever: one streaming epoch after another."""
        while True:
            yield from self.train_loader

    def client_state(self) -> dict[str, Any]:
        """What a checkpoint records besides DeepSpeed's state; the tp slicing of every parameter for
        a later conversion to another layout (rgpt_dist/parallel/universal.py)."""
        if self._universal is None:
            self._universal = universal_info(self.model, layout_for(self.cfg.model))
        state = {"step": self.step, "tokens": self.tokens, "loader": self.train_loader.state_dict(),
                 "config": self.cfg.to_dict(), UNIVERSAL: self._universal}
        return state if self.best is None else {**state, "best": self.best}

    def resume(self) -> bool:
        """Load the newest complete checkpoint, if resumption is on and there is one."""
        tag = self.ckpt.newest_valid() if self.cfg.checkpoint.resume else None
        if tag is None:
            return False
        saved = self.ckpt.saved_config(tag)
        self._check_same_run(saved, tag)  # before any state is loaded
        change = self._layout_change(saved, tag)
        state = self.ckpt.load(self.engine, tag, universal=change is not None)
        if change and self.dims.is_main:
            print(f"converted {tag} ({change}) through DeepSpeed's universal checkpoint", flush=True)
        if saved is None:  # a checkpoint written before run_config.json: its client state holds the config
            self._check_same_run(state.get("config"), tag)
        self.step, self.tokens = state["step"], state["tokens"]
        apply_config(self.optimizer, self.engine.lr_scheduler, self.cfg.train)  # a changed lr, betas, eps or decay
        self.train_loader.load_state_dict(state["loader"])
        self.best = state.get("best")  # the selection continues where it was (checkpoint.keep_best)
        self.ckpt.record_best(self.best)
        self.sink.resume_at(self.step)
        if self.dims.is_main:
            print(f"resumed from {self.ckpt.dir / tag} at step {self.step}", flush=True)
        return True

    def _layout_change(self, saved: dict | None, tag: str) -> str | None:
        """What changed in the layout (ZeRO stage, tp, data-parallel size) since the checkpoint was
        written, when DeepSpeed's universal checkpoint converts it (rgpt_dist/parallel/universal.py);
        DifferentRun, before anything is loaded, when it cannot."""
        if saved is None:  # written before run_config.json: at its own layout (resumes as it always did)
            return None
        p = self.cfg.parallel
        change, problem = layout_change(saved, self.ckpt.dir / tag, p.zero_stage, p.tp_size, self.dims.dp)
        if problem:
            raise DifferentRun(f"{self.ckpt.dir / tag} was written at another layout ({change}) that cannot be "
                               f"converted: {problem}. Resume at the checkpoint's layout, or give this run its own "
                               f"log.run_dir (or checkpoint.dir)")
        return change

    def _check_same_run(self, saved: dict | None, tag: str) -> None:
        """A checkpoint continues only the run that wrote it: same model, seed and precision
        (DeepSpeed's bf16 mode and bf16-autocast store different weights and optimizer states); the
        budget, schedule and logging may change, e.g. to extend a run to the doubled budget, and so
        may the layout where it converts (_layout_change)."""
        if saved is None:
            return
        now = self.cfg.to_dict()
        # not data.task_sort_by_length: with or without it a step trains the same examples
        keys = [("model", k) for k in now["model"]] + [("train", "seed"), ("parallel", "dtype")] + [
            ("data", k) for k in ("task", "task_train_max", "task_grow_by", "task_grow_loss", "task_grow_steps")]
        # a field the checkpoint does not record is newer than it: it ran with the field's default
        then = {(a, b): saved.get(a, {}).get(b, _field_default(getattr(self.cfg, a), b)) for a, b in keys}
        diffs = [f"{a}.{b}: checkpoint {then[a, b]!r}, config {now[a][b]!r}"
                 for a, b in keys if then[a, b] != now[a][b]]
        if diffs:
            raise DifferentRun(f"{self.ckpt.dir / tag} belongs to a different run ({'; '.join(diffs)}): give "
                               f"this run its own log.run_dir (or checkpoint.dir), or checkpoint.resume=false")

    # ---- one optimizer step -----------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        cfg, step = self.cfg, self.step
        depths = step_depths(self.sampler, cfg.train.seed, step, self.accum)  # one r per micro-batch
        self.engine.train()
        skipped_before = self._skipped_total()
        losses, stats = [], []
        for micro, r in enumerate(depths):
            x, y = (t.to(self.engine.device, non_blocking=True) for t in next(self._data))
            if self.sample_log is not None:
                self.sample_log.record(step + 1, x)
            out = self.engine(x, y, r=r, noise_key=NoiseKey(cfg.train.seed, step, micro, self.dims.dp_rank),
                              stats=True)
            loss = out.loss + out.aux.get("aux_loss", 0.0)
            if _injected_nan(step, self.dims.rank):
                loss = loss * float("nan")
            self.engine.backward(loss)  # at the last micro-batch: also the reduction over dp ranks
            if micro == len(depths) - 1:
                norm = self._boundary(step)
            self.engine.step()
            losses.append(out.loss.detach().float())
            stats.append(out.aux.get("stats", {}))  # the family's per-step statistics, (r,) each
        if not self.own_norm:
            norm = _engine_norm(self.engine)  # computed by DeepSpeed's optimizer in its step
        # the depth (a list of one per micro-batch where they differ: depth_per=micro_batch)
        r = depths[0] if len(set(depths)) == 1 else depths
        record = {"step": step, "r": r, "loss": torch.stack(losses).mean().item(),
                  "lr": self.engine.get_lr()[0], "grad_norm": norm,
                  "skipped": self._skipped_total() > skipped_before, "skipped_total": self._skipped_total()}
        record.update({k: v.tolist() for k, v in _mean_step_stats(stats).items()})
        if self.compiled:  # cumulative: constant from the first steps on when nothing recompiles
            record.update(compile_stats())
        return record

    def _boundary(self, step: int) -> float:
        """Between the last backward (gradients reduced over dp ranks) and the optimizer step: the
        fault injection of RGPT_INJECT_GRAD_NAN, then at ZeRO-0 (parallel.zero.trainer_clips) the
        gradient norm before clipping (non-finite on a step that is skipped: the metrics sink logs it
        as null) and the clipping."""
        if _injected_nan(step, self.dims.rank, "RGPT_INJECT_GRAD_NAN"):
            self._inject_reduced_nan()
        if self.own_norm:
            norm = global_grad_norm(self.model.parameters(), self.engine.mpu)
            clip_gradients(self.model.parameters(), norm, self.cfg.train.grad_clip)
            return norm
        return float("nan")

    def _inject_reduced_nan(self) -> None:
        """One NaN in this rank's reduced gradient: p.grad at ZeRO-0 (DeepSpeed all-reduced it in
        the backward), the first sub-group's partition of the reduced gradients at ZeRO 1-3."""
        if self.cfg.parallel.zero_stage == 0:
            target = next(p.grad for p in self.model.parameters() if p.grad is not None)
        else:
            target = next(g for g in self.engine.optimizer.averaged_gradients[0] if g is not None)
        target.view(-1)[0] = float("nan")

    def _skipped_total(self) -> int:
        """Updates skipped for non-finite gradients: by DeepSpeed's ZeRO optimizers (which check
        overflow themselves and count it in engine.skipped_steps) or by our optimizer (ZeRO-0)."""
        return int(getattr(self.engine, "skipped_steps", 0)) + self.optimizer.skipped_total

    def _depth_agrees(self, r: int | list[int] | None) -> None:
        """Every rank must run the same depths (tensor-parallel and ZeRO-3 collectives inside the
        forward would otherwise hang): checked with one tiny all-reduce (of d and -d) per log step."""
        rs = [-1 if d is None else d for d in (r if isinstance(r, list) else [r])]
        t = torch.tensor(rs + [-d for d in rs], dtype=torch.int64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if not torch.equal(t[:len(rs)], -t[len(rs):]):
            raise RuntimeError(f"ranks disagree on the recurrence depth at step {self.step}: "
                               f"max {t[:len(rs)].tolist()}, min {(-t[len(rs):]).tolist()}")

    # ---- evaluation -------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Validation loss at the default depth and, for depth-recurrent families, the early-exit
        curve (loss at every depth 0..R) from the same all_exits pass; plus the mean over batches
        and ranks of each of the model's `aux['eval_metrics']` (every batch and rank returns the
        same names: one model), under its own name."""
        self.engine.eval()
        exits = self.cfg.eval.early_exit and self.sampler is not None
        losses, curves, extra = [], [], []
        for batch in self.val_batches:
            x, y = (t.to(self.engine.device, non_blocking=True) for t in batch)
            out = self.engine(x, y, all_exits=exits)
            losses.append(out.loss.float().item())
            if exits:
                curves.append(out.aux["exit_losses"].float())
            if "eval_metrics" in out.aux:
                extra.append({k: float(v) for k, v in out.aux["eval_metrics"].items()})
        values = [sum(losses) / len(losses)]
        if curves:
            values += torch.stack(curves).mean(0).tolist()
        names = list(extra[0]) if extra else []
        values = _mean_across_ranks(values + [sum(m[k] for m in extra) / len(extra) for k in names])
        metrics = dict(zip(names, values[len(values) - len(names):]))
        values = values[:len(values) - len(names)]
        self.engine.train()
        return {"step": self.step, "val_loss": values[0], **({"early_exit": values[1:]} if curves else {}), **metrics}

    # ---- the loop ---------------------------------------------------------------------------
    def fit(self) -> bool:
        """Train to train.max_steps; False when stopped early on a signal (after saving that step)."""
        cfg = self.cfg
        self._data = self._batches()
        window_t, window = time.perf_counter(), [0, 0.0, 0.0, 0]  # steps, model and hardware FLOPs, tokens
        self.sink.start_progress(self.step, cfg.train.max_steps)
        grows = getattr(self.train_loader, "grows", False)  # a length curriculum follows the loss
        while self.step < cfg.train.max_steps:
            record = self.train_step()
            self.step += 1  # optimizer steps completed; records carry this number
            self.sink.advance()
            rs = record["r"] if isinstance(record["r"], list) else [record["r"]]
            model_flops, hw_flops, tokens = step_flops(cfg, self.widths(self.step - 1), rs)
            self.tokens += tokens
            record["step"] = self.step
            window = [a + b for a, b in zip(window, (1, model_flops, hw_flops, tokens))]
            logged = record["skipped"] or self.step % cfg.log.every_steps == 0 or self.step == cfg.train.max_steps
            if logged or grows:
                record["loss"] = _mean_across_ranks([record["loss"]])[0]
            grown = self.train_loader.observe(record["loss"]) if grows else {}
            if logged or grown:
                self._depth_agrees(record["r"])
                self._log_train({**record, **grown}, window, time.perf_counter() - window_t)
                window_t, window = time.perf_counter(), [0, 0.0, 0.0, 0]
            self._check_finite(record)
            paused = time.perf_counter()  # evaluation and checkpoints do not count against tokens/s
            best = None
            if cfg.eval.every_steps and (self.step % cfg.eval.every_steps == 0 or self.step == cfg.train.max_steps):
                evaluation = self.evaluate()
                self._log_eval(evaluation)
                if cfg.checkpoint.keep_best and improves(self.best, evaluation["val_loss"]):
                    self.best = best = {"step": self.step, "val_loss": evaluation["val_loss"]}
            saved = self.step % cfg.checkpoint.every_steps == 0 or self.step == cfg.train.max_steps or best is not None
            if saved:
                self.ckpt.save(self.engine, self.step, self.client_state(), best=best)
            if self.stop is not None and self.stop.agreed(_comm_device()) and self.step < cfg.train.max_steps:
                return self._stop_early(saved)
            window_t += time.perf_counter() - paused
        return True

    def _stop_early(self, saved: bool) -> bool:
        if not saved:
            self.ckpt.save(self.engine, self.step, self.client_state())
        if self.dims.is_main:
            where = self.stop.received.name if self.stop.received else "a signal on another rank"
            print(f"step {self.step:6d} | stop requested ({where}): saved this step and stopped", flush=True)
        return False

    def _check_finite(self, record: dict[str, Any]) -> None:
        """A skipped step (non-finite gradients on any rank: the optimizer left the weights alone on
        every rank) is logged at once; after train.max_nonfinite_steps in a row, save and stop."""
        if not record["skipped"]:
            self.consecutive_nonfinite = 0
            return
        self.consecutive_nonfinite += 1
        if self.dims.is_main:
            print(f"step {self.step:6d} | skipped: non-finite gradients ({self.consecutive_nonfinite} in a row, "
                  f"{record['skipped_total']} in all)", flush=True)
        if self.consecutive_nonfinite >= self.cfg.train.max_nonfinite_steps:
            self.ckpt.save(self.engine, self.step, self.client_state())
            raise NonFiniteError(f"{self.consecutive_nonfinite} consecutive steps had non-finite gradients "
                                 f"(train.max_nonfinite_steps={self.cfg.train.max_nonfinite_steps}); saved "
                                 f"step {self.step} and stopped")

    def _log_train(self, record: dict[str, Any], window: list, elapsed: float) -> None:
        steps, model_flops, hw_flops, tokens = window
        capacity = self.peak * self.dims.world * elapsed
        tokens_per_s = tokens / elapsed
        record.update(tokens=self.tokens, tokens_per_s=tokens_per_s, mfu=model_flops / capacity,
                      hfu=hw_flops / capacity)
        gate = "".join(f" | {k.removesuffix('_mean')} {sum(v) / len(v):.3f}" for k, v in record.items()
                       if k.endswith("_mean") and isinstance(v, list) and v)
        self.sink.log(record, f"step {self.step:6d} | loss {record['loss']:.4f} | r {record['r']} | lr {record['lr']:.2e} | "
                              f"grad {record['grad_norm']:.3f} | {tokens_per_s:,.0f} tok/s | mfu {record['mfu']:.1%}{gate}")

    def _log_eval(self, record: dict[str, Any]) -> None:
        curve = record.get("early_exit")
        table = "" if not curve else "\n" + "\n".join(f"    exit r*={k:2d}: {v:.4f}" for k, v in enumerate(curve))
        extra = "".join(f" | {k} {v:.4f}" for k, v in record.items() if k not in ("step", "val_loss", "early_exit"))
        self.sink.log(record, f"eval step {record['step']:6d} | val_loss {record['val_loss']:.4f}{extra}{table}")


def _field_default(section: Any, name: str) -> Any:
    """The default of a config section's field (None for a field the section does not have)."""
    for f in dataclasses.fields(section):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            return None if f.default_factory is dataclasses.MISSING else f.default_factory()
    return None


def improves(best: dict[str, Any] | None, val_loss: float) -> bool:
    """Whether an evaluation's loss becomes the best (checkpoint.keep_best): finite and strictly
    below the best so far, so that the earliest step wins an exact tie."""
    return math.isfinite(val_loss) and (best is None or val_loss < best["val_loss"])


def _engine_norm(engine) -> float:
    """The norm DeepSpeed's optimizer computed; NaN where it computed none (the metrics sink logs
    a non-finite value as null, never as a made-up 0.0)."""
    norm = engine.get_global_grad_norm()
    return float("nan") if norm is None else float(norm)


def _mean_step_stats(per_micro: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per-step statistics (name -> (r,)) of each micro-batch -> their mean per step over the
    micro-batches that ran it (with one depth for all: the plain mean, summed as sum(v / n))."""
    out = {}
    for k in dict.fromkeys(k for stats in per_micro for k in stats):
        vs = [stats[k].float() for stats in per_micro if k in stats]
        n = torch.tensor([sum(len(v) > i for v in vs) for i in range(max(len(v) for v in vs))],
                         dtype=torch.float32, device=vs[0].device)              # micro-batches per step
        total = torch.zeros_like(n)
        for v in vs:
            total[:len(v)] += v / n[:len(v)]
        out[k] = total
    return out
