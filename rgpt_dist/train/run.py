"""Compose a training run from a validated config: process group, model, checkpointing, engine,
data, checkpoints, metrics, then the loop."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from rgpt_dist.config.experiment import Config
from rgpt_dist.data.streaming import token_dataset, token_loader
from rgpt_dist.data.suites import task_loaders
from rgpt_dist.data.uri import RemoteDataError
from rgpt_dist.durable import atomic_create_text, atomic_write_text
from rgpt_dist.models.layers import LayerFactory
from rgpt_dist.models.spec import spec_for
from rgpt_dist.parallel.checkpointing import apply_activation_checkpointing
from rgpt_dist.parallel.compile import apply_compile
from rgpt_dist.parallel.dims import ParallelDims
from rgpt_dist.parallel.health import Diagnosis, Heartbeat
from rgpt_dist.parallel.reshard import split_state_dict, tp_layout
from rgpt_dist.parallel.zero import gather_per_unit, init_distributed, init_engine, register_tied_parameters
from rgpt_dist.registry import build_model
from rgpt_dist.safe_load import UntrustedCheckpoint
from rgpt_dist.train.checkpoint import CheckpointManager, ConversionFailed, SaveFailed, SaveRefused
from rgpt_dist.train.init_from import InitFromMismatch, load_initial_weights
from rgpt_dist.train.init_from import wanted as init_wanted
from rgpt_dist.train.metrics import MetricsSink
from rgpt_dist.train.optim import make_optimizer, make_scheduler
from rgpt_dist.train.preemption import EXIT_PREEMPTED, StopRequested, ignore_signals, requeue_slurm_job
from rgpt_dist.train.trainer import DifferentRun, Trainer

EXIT_REFUSED = 2  # like a bad config: nothing ran, nothing was written
EXIT_SAVE_FAILED = 74  # EX_IOERR: a checkpoint could not be written; the previous one stays the newest
INTERRUPTED = "interrupted.json"  # left in the run directory when a peer was lost: requeue and resume


def _loaders(cfg: Config, dims: ParallelDims):
    """(training loader, validation batches) from the data source: a task (data.task, of the model's
    suite: rgpt_dist.data.suites) or token shards. Every rank reads; the tp ranks of a replica read the same samples
    (a task's loader is indexed by dp rank; for shards, streaming's `replication`)."""
    d, t = cfg.data, cfg.train
    if d.task:
        return task_loaders(cfg, dims.dp, dims.dp_rank)
    common = dict(batch_size=t.micro_batch_size, seed=t.seed, num_canonical_nodes=d.num_canonical_nodes,
                  cache_dir=d.cache_dir or None, replication=dims.tp if dims.tp > 1 else None,
                  vocab_size=cfg.model.vocab_size, download_retry=d.download_retry,
                  download_timeout=d.download_timeout_s, predownload=d.predownload or None,
                  cache_limit=d.cache_limit or None)
    train = token_loader(token_dataset(d.paths, d.train_split, shuffle=d.shuffle, **common), t.micro_batch_size,
                         d.num_workers)
    val = []
    if cfg.eval.every_steps:  # a fixed set of validation batches, read once
        val_iter = iter(token_loader(token_dataset(d.paths, d.val_split, shuffle=False, **common), t.micro_batch_size))
        val = [b for _, b in zip(range(cfg.eval.batches), val_iter)]
        if not val:
            raise ValueError(f"{d.val_split} split has fewer than {t.micro_batch_size} samples per rank")
    return train, val


def with_loss_norm(factory: LayerFactory, cfg: Config) -> LayerFactory:
    """The layer factory reducing token losses as train.loss_norm says (LayerFactory.loss_weights)."""
    factory.loss_norm = cfg.train.loss_norm
    return factory


def shard_model(full: torch.nn.Module, cfg: Config, dims: ParallelDims) -> torch.nn.Module:
    """The tensor-parallel model for this rank, initialised by splitting the full (tp = 1) one, so a
    run starts from the same weights whatever its tp size."""
    # megatron-core (seconds to import, with warnings) only for a run with tp > 1
    from rgpt_dist.parallel.tensor_parallel import TensorParallelFactory, init_tensor_parallel

    init_tensor_parallel(dims.tp)
    model = build_model(cfg.model, factory=with_loss_norm(TensorParallelFactory(), cfg))
    model.load_state_dict(split_state_dict(full.state_dict(), tp_layout(model), dims.rank % dims.tp, dims.tp))
    return model


def _start_from(model: torch.nn.Module, cfg: Config, dims: ParallelDims) -> bool:
    """checkpoint.init_from's weights into the full model, before tp sharding (every tp rank splits
    the same weights); False, said once, when they are another model's: every rank reads the same
    source, so all refuse together."""
    if not init_wanted(cfg):
        return True
    try:
        load_initial_weights(model, cfg.checkpoint.init_from)
    except InitFromMismatch as e:
        if dims.is_main:
            print(f"train: {e}", file=sys.stderr, flush=True)
        return False
    if dims.is_main:
        print(f"weights from {cfg.checkpoint.init_from}", flush=True)
    return True


def train(cfg: Config) -> int:
    """Run (or resume) training; returns the process exit status: 0 when train.max_steps is reached,
    EXIT_PREEMPTED when stopped on a signal after saving (requeued under SLURM), EXIT_REFUSED when
    the checkpoint to resume from would run code on loading or belongs to a different run, the
    weights of checkpoint.init_from are another model's, or a save met a planted link or file,
    EXIT_SAVE_FAILED when a checkpoint could not be written (the previous one stays the newest), and
    EXIT_PREEMPTED at once, leaving RUN_DIR/interrupted.json, when a peer was lost or stalled."""
    stop = StopRequested()  # before anything slow: a signal during start-up stops after step one
    # checkpoints and exports record where the data is; a relative path found in one is resolved
    # against that checkpoint or export (never a reader's current directory), so record absolute ones
    cfg.data.paths = [p if "://" in p else os.path.abspath(p) for p in cfg.data.paths]
    dims = init_distributed(cfg)
    run_dir = Path(cfg.log.run_dir)
    if dims.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
    model = build_model(cfg.model, factory=with_loss_norm(LayerFactory(), cfg), seed=cfg.train.seed)
    if not _start_from(model, cfg, dims):
        return EXIT_REFUSED
    if dims.tp > 1:
        model = shard_model(model, cfg, dims)
    compiled = apply_compile(model, cfg.parallel.compile_mode(), cfg.parallel.compile_backend)
    partial = spec_for(cfg.model).refusals.get("compile_blocks")
    if compiled and cfg.parallel.compile_mode() == "blocks" and partial and dims.rank == 0:
        print(f"note: {partial}", file=sys.stderr, flush=True)
    if compiled and cfg.parallel.zero_stage == 3:
        register_tied_parameters(model)
    apply_activation_checkpointing(model, cfg.parallel.activation_checkpointing)
    optimizer = make_optimizer(model, cfg.train)
    engine = init_engine(model, optimizer, make_scheduler(optimizer, cfg.train), cfg, dims)
    if compiled and cfg.parallel.zero_stage == 3:
        gather_per_unit(engine, compiled)
    train_loader, val_batches = _loaders(cfg, dims)
    ckpt = CheckpointManager(cfg.checkpoint.dir or run_dir / "checkpoints", cfg.checkpoint.keep_last, dims.rank,
                             trust=cfg.checkpoint.trust_pickle)
    sink = MetricsSink(cfg, dims.is_main)
    trainer = Trainer(cfg, dims, engine, optimizer, train_loader, val_batches, ckpt, sink, stop)
    heartbeat = Heartbeat.start(dims.rank, dims.world, cfg.parallel.timeout_s, lambda: trainer.step) \
        if dims.world > 1 else None
    outcome = None
    try:
        outcome = _fit(trainer, cfg, dims, run_dir, heartbeat)
    finally:
        if heartbeat is not None:
            heartbeat.close()
        sink.close()
        if not isinstance(outcome, Diagnosis):  # a lost peer keeps the handler until signals are ignored
            stop.close()
    if isinstance(outcome, Diagnosis):  # the process group is broken: no barrier, no teardown
        _peer_lost(outcome, run_dir, dims, trainer.step)
    if outcome != "finished":
        ignore_signals()  # saved or refused: the exit status must be the same on every rank
    torch.distributed.barrier()  # no rank exits (and makes torchrun SIGTERM the rest) before all ignore
    # joined here, not by the interpreter's teardown: a communicator thread still joinable when its
    # object is destroyed at exit aborts the process ("terminate called without an active exception")
    torch.distributed.destroy_process_group()
    if outcome != "stopped":
        return {"finished": 0, "refused": EXIT_REFUSED, "save failed": EXIT_SAVE_FAILED}[outcome]
    if dims.is_main:
        print(requeue_slurm_job() if cfg.checkpoint.requeue else "stopped on a signal: run again to resume",
              flush=True)
    return EXIT_PREEMPTED


def _fit(trainer: Trainer, cfg: Config, dims: ParallelDims, run_dir: Path, heartbeat: Heartbeat | None):
    """Resume and train: "finished", "stopped" (on a signal, saved), "refused" or "save failed" (on
    every rank together, said once), or the Diagnosis of a peer lost or stalled (this rank's view; an
    exception with every peer still answering is the run's own and propagates)."""
    try:
        trainer.resume()
        if dims.is_main:  # after resume: a run refused for another's checkpoint leaves its config
            atomic_write_text(run_dir / "config.yaml", cfg.to_yaml())
        return "finished" if trainer.fit() else "stopped"
    except (UntrustedCheckpoint, DifferentRun, SaveRefused, SaveFailed, ConversionFailed) as e:  # on every rank together
        if dims.is_main:
            print(f"train: {e}", file=sys.stderr, flush=True)
        return "save failed" if isinstance(e, SaveFailed) else "refused"
    except RemoteDataError as e:  # object storage that does not answer: requeue, as for a lost node
        if heartbeat is not None:
            heartbeat.report_failure(e, requeue=True)
        return Diagnosis([str(e)], [], type(e).__name__, what="a shard could not be read",
                         reason="object storage")
    except Exception as e:  # a collective that failed: a peer lost or stalled, or an error of ours
        lost = heartbeat.diagnose(e) if heartbeat is not None else None
        if lost is not None and lost.lost:
            return lost
        if lost is None and heartbeat is not None:  # every peer answers: the error is this rank's own
            heartbeat.report_failure(e)
        if lost is not None:  # another rank failed first: this one's error is only the consequence
            print(f"train: {lost.message(dims.rank, trainer.step)}", file=sys.stderr, flush=True)
        raise


def _peer_lost(lost: Diagnosis, run_dir: Path, dims: ParallelDims, step: int) -> None:
    """Say which peer stopped answering, leave RUN_DIR/interrupted.json (slurm/supervise.sh requeues a
    job whose run left it) and exit EXIT_PREEMPTED at once: the process group is broken, so neither
    its barrier nor its teardown can complete. The first survivor to see the failure writes the
    marker (whole, never replaced: a later survivor, ended by the job's teardown, knows less); what
    the run saved is untouched, and it resumes from its newest checkpoint."""
    # srun ends the job step as soon as any task fails (--kill-on-bad-exit): its SIGTERM must not kill
    # this rank before the marker is written (the marker first, then the message)
    ignore_signals()
    message = lost.message(dims.rank, step)
    try:
        atomic_create_text(run_dir / INTERRUPTED, json.dumps({"reason": lost.reason, "message": message,
                                                              "rank": dims.rank, "step": step}) + "\n")
    except OSError as e:
        print(f"train: could not write {run_dir / INTERRUPTED}: {e}", file=sys.stderr, flush=True)
    print(f"train: {message}. Stopping: run again (the batch script requeues) to resume from the newest "
          "complete checkpoint.", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(EXIT_PREEMPTED)
