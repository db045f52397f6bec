"""Run sections: data, parallelism, checkpoints, evaluation and logging. No torch import."""
from __future__ import annotations

import dataclasses
import re
from typing import Literal

from rgpt_dist.data.suites import not_a_task, suite_of_task
from rgpt_dist.data.uri import uri_problem
from rgpt_dist.sections import Section, out_of_bounds

MAX_WORKERS = 256
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


def torch_cuda_available() -> bool:
    """Imports torch: for resolving `auto` settings when a run starts, never while loading a config."""
    import torch  # torch only here: the module's other functions run without it

    return torch.cuda.is_available()


@dataclasses.dataclass
class DataConfig(Section):
    """Where training and validation samples come from (rgpt-prep outputs)."""

    paths: list[str] = dataclasses.field(default_factory=lambda: ["data/python-stdlib"])
    """rgpt-prep output directories or remote URIs; their splits are read as one stream set."""
    train_split: str = "train"
    """Split read for training."""
    val_split: str = "val"
    """Split read for evaluation."""
    shuffle: bool = True
    """Shuffle training samples (seeded by train.seed)."""
    num_canonical_nodes: int = 1
    """Fixes streaming's global sample order independently of the number of ranks (resumption on
    another world size relies on it staying the same)."""
    num_workers: int = 0
    """Loader worker processes per rank (0: load in the training process); 0 <= num_workers <= 256
    (each is a process: more cannot be useful, and a typo would fork that many per rank)."""
    cache_dir: str = ""
    """Local cache for remote URIs (default: a private per-user directory, $TMPDIR/rgpt-cache-UID/streaming;
    a directory given here must be this user's, mode 0700)."""
    download_retry: int = 2
    """Remote URIs: attempts at each shard download (streaming's download_retry, the total; each has
    botocore's own retries; 1, 2, 4 ... s apart) before the run stops and asks to be requeued;
    1 <= n <= 100."""
    download_timeout_s: float = 60.0
    """Remote URIs: seconds one shard download may take before it counts as failed (> 0)."""
    predownload: int = 0
    """Remote URIs: samples per rank downloaded ahead of the one being read (0: streaming's default,
    8 x the micro-batch)."""
    cache_limit: str = ""
    """Remote URIs: the most the cache may hold, e.g. "20gb" (streaming evicts the coldest shards
    beyond it; "" = no limit). At least the largest shard, or the run is refused at start."""
    task: str = ""
    """A task of a task suite (rgpt_dist.data.suites) to train on, generated on the fly: an
    algorithmic task of the RLT paper (parity, s5_standard, s5_swaps, mod5_flat, mod5_brackets,
    addition; rgpt_dist.algorithmic.suite) or a thinking model's task (graph, logic, relational;
    rgpt_dist.thinking.suite); "" = the token shards of `paths` (which a task leaves unused, as
    it does the splits, shuffle, workers and eval.batches: validation is the task's whole validation
    set)."""
    task_train_max: int = 0
    """Train on the task's training lengths up to this one only (0 = its whole training grid, the
    paper's); a CPU-scale reduction (`make rlt` trains parity on 3-16 bits). S5, whose grid is the
    single length 32, trains on 1..cap operations below 32. Validation and test keep the task's
    grids. At least the grid's shortest training length; needs data.task."""
    task_grow_by: int = 0
    """A length curriculum (0 = none; needs data.task_train_max): each time the training loss (the
    mean over ranks) has stayed below data.task_grow_loss for data.task_grow_steps optimizer steps in
    a row, the cap grows by this many lengths, until the task's whole training grid (the paper's) is
    reached. The cap each growth reaches is logged (metrics.jsonl: task_train_max)."""
    task_grow_loss: float = 0.01
    """The training loss below which a step counts towards growing the cap (> 0)."""
    task_grow_steps: int = 10
    """Steps in a row below data.task_grow_loss that grow the cap (>= 1)."""
    task_sort_by_length: bool = False
    """Length buckets (an algorithmic task): sort each optimizer step's examples by length and cut
    them into its micro-batches (train.micro_batch_size; the data-parallel ranks' side by side), each
    padded to its own longest instead of the step's: the same examples per step, less padding
    computed (benchmarks/algo_buckets.py; docs/algorithmic.md). Under train.loss_norm=example
    (required) a causal model whose forward does not depend on its micro-batch's slot or width (RLT,
    the Transformer baselines without dropout) gets the padded step's gradients up to rounding; a
    depth or noise drawn per micro-batch, dropout, or MoR's routing over the padded width see other
    draws. Needs more than one micro-batch per step (train.global_batch_size > train.micro_batch_size)."""

    def problems(self, path: str) -> list[str]:
        out = []
        if self.task:
            suite = suite_of_task(self.task)
            if suite is None:
                out.append(f"{path}.task={not_a_task(self.task)}")
            else:
                out += suite.data_problems(self, path)
        elif self.task_train_max:
            out.append(f"{path}.task_train_max={self.task_train_max!r} needs {path}.task (it caps a task's "
                       f"training lengths)")
        elif self.task_sort_by_length:
            out.append(f"{path}.task_sort_by_length=true needs {path}.task (it sorts a task's examples)")
        elif not self.paths:
            out.append(f"{path}.paths is empty: give at least one rgpt-prep output (or {path}.task)")
        if self.task_grow_by and not self.task_train_max:
            out.append(f"{path}.task_grow_by={self.task_grow_by!r} grows {path}.task_train_max, which is 0 (the whole "
                       f"grid): set the cap to start from, e.g. {path}.task_train_max=16")
        out += out_of_bounds(path, ">=", 0, task_grow_by=self.task_grow_by)
        out += out_of_bounds(path, ">", 0, task_grow_loss=self.task_grow_loss)
        out += out_of_bounds(path, ">=", 1, task_grow_steps=self.task_grow_steps)
        out += out_of_bounds(path, ">=", 1, num_canonical_nodes=self.num_canonical_nodes)
        out += out_of_bounds(path, ">=", 1, download_retry=self.download_retry)
        out += out_of_bounds(path, ">=", 0, predownload=self.predownload)
        out += out_of_bounds(path, "<=", 100, download_retry=self.download_retry)
        out += out_of_bounds(path, ">", 0, download_timeout_s=self.download_timeout_s)
        if self.cache_limit and not re.fullmatch(r"[0-9]+(\.[0-9]+)?[kmgt]?b?", self.cache_limit.lower()):
            out.append(f"{path}.cache_limit={self.cache_limit!r} is not a size like 500mb or 20gb")
        out += [f"{path}.paths[{i}]={p!r}: {problem}" for i, p in enumerate(self.paths if not self.task else [])
                if (problem := uri_problem(p))]
        out += out_of_bounds(path, "<=", MAX_WORKERS, num_workers=self.num_workers)
        return out + out_of_bounds(path, ">=", 0, num_workers=self.num_workers)


@dataclasses.dataclass
class ParallelConfig(Section):
    """How the model is sharded and computed."""

    zero_stage: int = 2
    """DeepSpeed ZeRO stage: 0 (DDP-like), 1 (optimizer states), 2 (+gradients), 3 (+parameters)."""
    dtype: Literal["fp32", "bf16", "bf16-autocast"] = "bf16"
    """Precision (docs/performance.md, "Precision"). fp32: weights, compute, gradients and their
    reduction in fp32. bf16: DeepSpeed's bf16 mode: bf16 module weights, activations and gradients
    (the whole residual stream and RecurrentGPT's gate lerp in bf16), fp32 master weights and
    optimizer states inside DeepSpeed's optimizer. bf16-autocast: the paper's (nanoGPT's) mixed
    precision: fp32 weights, optimizer states and gradients, reduced across ranks in fp32; the
    forward (training and evaluation) under torch.autocast(bfloat16), so matmuls and attention run
    in bf16 while the residual stream, layer norms, softmax and loss stay fp32 (DeepSpeed's
    `torch_autocast` section)."""
    activation_checkpointing: Literal["none", "recurrence", "selective", "blocks"] = "recurrence"
    """Recompute activations in backward: none; recurrence = each step of the shared core (or each
    block of a dense model) whole; selective = the same units, keeping matmul and attention outputs
    (less recompute, more memory; refused under zero_stage=3 and tp_size > 1, see
    _selective_problems); blocks = recurrence plus every prelude/coda block."""
    tp_size: int = 1
    """Tensor-parallel size (megatron-core; issue #5). 1 = no tensor parallelism."""
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """torch.distributed backend; auto = nccl with CUDA, gloo without."""
    compile: Literal["auto", "none", "blocks", "model"] = "auto"
    """torch.compile (rgpt_dist.parallel.compile): blocks = every transformer block and the LM head
    compiled, the recurrence loop eager (a new depth r every step compiles nothing new); model = the
    whole forward, one graph per depth; none = eager; auto = blocks with CUDA, none without."""
    compile_backend: str = "inductor"
    """torch.compile backend: inductor (generated kernels; what GPU runs use), aot_eager (the same
    forward and backward graphs run by eager kernels: checks tracing on CPU in seconds instead of
    minutes) or eager (dynamo's capture only)."""
    timeout_s: float = 600.0
    """Seconds a collective (an all-reduce, a barrier, a checkpoint's agreement) waits for every peer
    before the run gives up on it (torch.distributed's process-group timeout, gloo and NCCL alike;
    torch's own defaults are 30 minutes for gloo and 10 for NCCL). A rank that stalls (a hung GPU, a
    stopped process) or a lost node then ends the job within this many seconds plus a few heartbeats,
    naming the rank and node that stopped answering (rgpt_dist/parallel/health.py), and the job is
    requeued from its newest checkpoint. It must exceed the longest legitimate wait of one rank for
    the others: a checkpoint save or an evaluation running unevenly, a first compilation (600, as
    Megatron-LM's default, covers these on GPU clusters; raise it for very slow checkpoint storage)."""

    def compile_mode(self) -> str:
        """`compile` with auto resolved for this machine."""
        if self.compile != "auto":
            return self.compile
        return "blocks" if torch_cuda_available() else "none"

    def problems(self, path: str) -> list[str]:
        out = []
        if self.zero_stage not in (0, 1, 2, 3):
            out.append(f"{path}.zero_stage={self.zero_stage} must be 0, 1, 2 or 3")
        out += out_of_bounds(path, ">=", 1, timeout_s=self.timeout_s)
        if self.compile == "model" and self.zero_stage == 3:
            out.append(f"{path}.compile=model cannot run under {path}.zero_stage=3 (ZeRO-3's parameter gathering "
                       f"hooks every submodule inside the graph): use {path}.compile=blocks")
        out += self._selective_problems(path)
        if self.compile_backend not in COMPILE_BACKENDS:
            out.append(f"{path}.compile_backend={self.compile_backend!r} must be one of {', '.join(COMPILE_BACKENDS)}")
        return out

    def _selective_problems(self, path: str) -> list[str]:
        """`selective` keeps the outputs of matmuls (torch.utils.checkpoint's selective policy); two
        layouts break that, measured in tests/train/test_distributed.py, so they are refused here
        rather than crash or train on wrong gradients. ZeRO-3 gathers parameters inside the
        checkpointed unit, and the policy meets the gather's allocations only in the recomputation
        ('aten.empty.memory_format encountered during backward but not found in storage'). Under
        tensor parallelism megatron's row-parallel layers all-reduce a matmul's output in place,
        the very tensor the policy keeps, so the recomputation no longer reproduces the forward:
        the gradients differ (relative 9e-5 in the norm at step 1, 1.7e-3 by step 4)."""
        if self.activation_checkpointing != "selective":
            return []
        reasons = []
        if self.zero_stage == 3:
            reasons.append(f"{path}.zero_stage=3 (ZeRO-3 gathers parameters inside the checkpointed units and the "
                           f"selective policy fails in the first backward)")
        if self.tp_size > 1:
            reasons.append(f"{path}.tp_size={self.tp_size} (megatron's row-parallel all-reduce works in place on the "
                           f"matmul outputs selective keeps, so the recomputed activations and the gradients are wrong)")
        return [f"{path}.activation_checkpointing=selective cannot run under {reason}: use "
                f"{path}.activation_checkpointing=recurrence" for reason in reasons]


@dataclasses.dataclass
class CheckpointConfig(Section):
    """When and where training state is saved."""

    every_steps: int = 1000
    """Save every N optimizer steps (and at the end)."""
    keep_last: int = 3
    """Complete checkpoints kept; older ones are deleted."""
    dir: str = ""
    """Checkpoint directory (default RUN_DIR/checkpoints)."""
    resume: bool = True
    """Resume from the newest complete, verified checkpoint in `dir` when there is one."""
    requeue: bool = True
    """On SIGUSR1/SIGTERM every rank finishes the current step, the step is saved and the run stops;
    under SLURM, also `scontrol requeue` the job so that it resumes from that checkpoint."""
    keep_best: bool = False
    """Also keep the checkpoint of the evaluation with the minimum validation loss (the earliest step
    on an exact tie; the RLT paper's checkpoint selection): saved at that step if the cadence did not,
    named in DIR/best.json and never pruned. Requires eval.every_steps > 0."""
    init_from: str = ""
    """A run directory, its checkpoints/, one step_* directory or an rgpt-export whose model weights
    start this run (read without running code; names and shapes must match this model's): not its
    optimizer, schedule or step. Ignored once the run has a checkpoint of its own to resume from.
    Ouro's stage II (model.stage=gate) starts so from a stage-I run."""
    trust_pickle: bool = False
    """UNSAFE. Resume from checkpoint files that need full unpickling (code the file names runs on
    load). Off: such a file is refused with its name. Only for checkpoints you wrote yourself with an
    older DeepSpeed whose records are not on rgpt_dist.safe_load's allow-list (docs/security.md)."""

    def problems(self, path: str) -> list[str]:
        return out_of_bounds(path, ">=", 1, every_steps=self.every_steps, keep_last=self.keep_last)


@dataclasses.dataclass
class EvalConfig(Section):
    """Validation during training."""

    every_steps: int = 1000
    """Evaluate every N optimizer steps (and at the end); 0 disables."""
    batches: int = 20
    """Validation micro-batches per rank per evaluation."""
    early_exit: bool = True
    """Also report the loss at every depth 0..R from one all_exits pass (recurrent families)."""

    def problems(self, path: str) -> list[str]:
        return (out_of_bounds(path, ">=", 0, every_steps=self.every_steps)
                + out_of_bounds(path, ">=", 1, batches=self.batches))


@dataclasses.dataclass
class LogConfig(Section):
    """Console, RUN_DIR/metrics.jsonl and wandb."""

    run_dir: str = "runs/default"
    """Directory of this run: metrics.jsonl, the resolved config, checkpoints, wandb files."""
    every_steps: int = 10
    """Log training metrics every N optimizer steps."""
    wandb: Literal["auto", "online", "offline", "disabled"] = "auto"
    """auto = online with an API key and WANDB_MODE unset, else offline; WANDB_MODE wins when set."""
    project: str = "rgpt-dist"
    """wandb project."""
    name: str = ""
    """Run name (default: the run directory's name)."""

    def problems(self, path: str) -> list[str]:
        out = []
        if not self.run_dir:
            out.append(f"{path}.run_dir is empty")
        return out + out_of_bounds(path, ">=", 1, every_steps=self.every_steps)
