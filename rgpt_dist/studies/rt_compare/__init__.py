"""The layerwise Recurrent Transformer against its dense partner at CPU scale (`rgpt study rt-compare`,
`make compare-rt`); its cluster grid in the authors' recipe: rt_compare/grid.py. The authors' trade at CPU scale, our dense model against a
layerwise Recurrent Transformer with half its layers at the same non-embedding parameters, on the
same tokens, two seeds each.

    dense  4 x 64 (4 heads)            4 x 12 x 64^2 = 196,608 matrix parameters
    RT     2 x 90 (6 heads of 15)      2 x 12 x 90^2 = 194,400 (-1.1%)

Both from the `make compare` recipe (launch.PRESETS: 100 steps of 16 x 128 tokens of the embedded
corpus, 2-process ZeRO-2, fp32), each run from the dense grid config with its flavour swapped in
(`model=rt-dense-debug` / `model=rt-debug`, the RT's and the dense partner's block options: ALiBi,
QK-norm, RMSNorm, GELU 4d, no biases). Matched on non-embedding parameters (the authors' convention).
The RT's head is tied here (the authors' is untied: at this width an untied head would add 4.5M
parameters to a 0.2M-parameter stack); even so the embeddings dominate the totals (50,257 x 90 against
50,257 x 64: 4.72M against 3.41M), which favours the RT's wider token representation as much as its
recurrence: the comparison checks the machinery, it does not test the paper's claim. No torch import.
"""
from __future__ import annotations

from pathlib import Path

from rgpt_dist.models.flavours import FLAVOURS
from rgpt_dist.studies.base import Context, LanguageModelStudy, Run
from rgpt_dist.studies.launch import cpu_overrides
from rgpt_dist.studies.rt_compare import grid as rt_grid
from rgpt_dist.studies.rt_compare import report as rt_report

CONFIG = "configs/experiments/gpt2-small-20k.yaml"
"""The grid config every run starts from (its recipe; the model is replaced by the flavour)."""
MODELS = {"dense 4x64": ("rt-dense-debug", {"n_layer": 4, "d_model": 64, "n_head": 4}),
          "RT 2x90": ("rt-debug", {"n_layer": 2, "d_model": 90, "n_head": 6, "tie_embeddings": True})}
SEEDS = (1337, 42)


def plan() -> list[Run]:
    """Each model at each seed, the models interleaved (a stopped study has both at the first seed)."""
    return [Run(name=f"{model.replace(' ', '-').lower()}-seed{seed}", config=CONFIG,
                family=FLAVOURS[MODELS[model][0]]["family"], seed=seed, model=model,
                overrides=(f"model={MODELS[model][0]}", *(f"model.{k}={v}" for k, v in MODELS[model][1].items())))
            for seed in SEEDS for model in MODELS]


def overrides(run: Run, preset: str, data: str, out: str | Path) -> list[str]:
    """The compare preset's overrides; the model (its flavour, then its shape) follows as run.overrides."""
    return cpu_overrides(preset, run.family, run.seed, data, Path(out) / run.name)


class RTCompare(LanguageModelStudy):
    name = "rt-compare"
    summary = "the layerwise Recurrent Transformer against its dense partner, two seeds (about 8 min)"
    reproduces = ("the authors' trade (half the layers, equal non-embedding parameters) at d = 64-90: checks the "
                  "machinery, does not test the paper's claim (the embeddings dominate at this width)")

    def plan(self, preset: str) -> list[Run]:
        return plan()

    def overrides(self, run: Run, ctx: Context) -> list[str]:
        return overrides(run, ctx.preset, ctx.data, ctx.out)

    def report(self, ctx: Context, runs: list[Run]) -> dict[str, Path]:
        return rt_report.report(ctx.out, runs)

    def grid(self, root: Path) -> list[Path]:
        return rt_grid.write_grid(root)


RT_COMPARE = RTCompare()
