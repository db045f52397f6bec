# rgpt-dist: `make test` (what CI runs) and `make quickstart` work on a fresh machine.
# Everything installs into .venv, resolved against constraints.txt (torch pinned to the CPU wheel).
SHELL   := /bin/bash
PY      := .venv/bin/python
PIP     := $(PY) -m pip
STAMP   := .venv/.installed
export PYTHONHASHSEED := 0

.PHONY: help venv vocab test test-fast quickstart quickstart-eval compare compare-long compare-rt ablation phi algorithmic rlt thinking bench configs lock clean

.DEFAULT_GOAL := help
help:  ## this list (plain `make` prints it too)
	@grep -E '^[a-z][a-z-]*:.*## ' $(firstword $(MAKEFILE_LIST)) | sed -E 's/^([a-z-]+):.*## /\1|/' | awk -F'|' '{printf "  make %-16s %s\n", $$1, $$2}'

venv: $(STAMP)  ## install the pinned stack into .venv (constraints.txt)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	# PyPI's torchvision (pulled by mosaicml-streaming) cannot load beside CPU torch.
	$(PIP) uninstall --quiet -y torchvision 2>/dev/null || true
	touch $(STAMP)

# The GPT-2 vocabulary, verified by sha256, into ~/.cache/rgpt-dist (from PyPI's openai-whisper sdist).
vocab: venv  ## venv, and the GPT-2 vocabulary (sha256-checked, from PyPI)
	.venv/bin/rgpt prep --fetch-vocab

test: vocab  ## the whole suite, what CI runs (.ci/run)
	TORCH_EXTENSIONS_DIR=$(CURDIR)/.venv/torch_extensions $(PY) -m pytest -q

test-fast: vocab  ## the suite without the tests marked slow
	$(PY) -m pytest -q -m "not slow"

# The main job on the embedded default: tokenize the local CPython standard library (rgpt-prep),
# then train a tiny RecurrentGPT on 2 CPU processes under ZeRO-2 (about 5 minutes on 2 cores),
# printing the falling loss and the early-exit table, and leaving checkpoints in runs/quickstart.
# glibc malloc is told to keep freed memory (see docs/performance.md): about 1.5x faster on CPU.
CPU_ENV := OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=34359738368 MALLOC_TRIM_THRESHOLD_=68719476736 \
           TORCH_EXTENSIONS_DIR=$(CURDIR)/.venv/torch_extensions
quickstart: vocab  ## tokenize the embedded corpus, train a tiny RecurrentGPT on 2 CPU processes
	test -f data/python-stdlib/manifest.json || \
	  .venv/bin/rgpt prep python-stdlib --out data/python-stdlib --seq-len 128 --workers 2
	rm -rf runs/quickstart
	$(CPU_ENV) .venv/bin/torchrun --standalone --nproc_per_node 2 launcher/train.py configs/experiments/quickstart.yaml

# Export the quickstart's checkpoint and evaluate it: early-exit curve, every Appendix E analysis (report.html) and the
# bundled lm-eval task over depths; outputs in eval/quickstart (shown in README.md).
quickstart-eval: vocab  ## export the quickstart checkpoint; early-exit curve, Appendix E, lm-eval
	.venv/bin/rgpt export runs/quickstart exports/quickstart --overwrite
	$(CPU_ENV) .venv/bin/rgpt eval curve exports/quickstart --data data/python-stdlib --batches 10 --out eval/quickstart
	$(CPU_ENV) .venv/bin/rgpt eval diagnostics exports/quickstart --all --data data/python-stdlib --batches 4 --out eval/quickstart
	$(CPU_ENV) HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 .venv/bin/rgpt eval lm-eval exports/quickstart --depths 0,1,4,8 --out eval/quickstart

# Table 1 at CPU scale (#14): every model of a scaled-down small isoFLOPs cell on the embedded corpus,
# the same tokens for all, a second seed of RecurrentGPT; the table and plot in runs/compare (~11 min).
compare: vocab  ## the six models of one scaled-down Table 1 cell, and the report
	test -f data/python-stdlib/manifest.json || \
	  .venv/bin/rgpt prep python-stdlib --out data/python-stdlib --seq-len 128 --workers 2
	$(CPU_ENV) $(PY) launcher/compare.py --data data/python-stdlib --out runs/compare

# The long CPU study (#29, docs/evaluation.md): every model of the small cell at d = 128 on 10x make
# compare's tokens (500 steps of 32 x 128, bf16 autocast), two seeds each, cheapest first: 4.5 hours
# on 2 cores (measured 2026-12-05). A killed run resumes from its checkpoint (every 50 steps); a
# finished one is recorded in results/compare-long (commit it) and not trained again on any machine:
# run it again until it ends.
compare-long: vocab  ## compare at 10x the tokens, two seeds per model (hours; resumes)
	test -f data/python-stdlib/manifest.json || \
	  .venv/bin/rgpt prep python-stdlib --out data/python-stdlib --seq-len 128 --workers 2
	$(CPU_ENV) $(PY) launcher/compare.py --preset long --data data/python-stdlib --out runs/compare-long \
	  --record results/compare-long

# The layerwise Recurrent Transformer against the dense model at CPU scale (#27, docs/families.md): dense 4 x 64
# against RT 2 x 90 at equal non-embedding parameters, make compare's recipe, two seeds each; runs/compare-rt.
compare-rt: vocab  ## the Recurrent Transformer against its dense partner, two seeds
	test -f data/python-stdlib/manifest.json || \
	  .venv/bin/rgpt prep python-stdlib --out data/python-stdlib --seq-len 128 --workers 2
	$(CPU_ENV) $(PY) launcher/compare.py --study rt --data data/python-stdlib --out runs/compare-rt

ablation: vocab  ## the paper's sequential component ablation at CPU scale
	test -f data/python-stdlib/manifest.json || \
	  .venv/bin/rgpt prep python-stdlib --out data/python-stdlib --seq-len 128 --workers 2
	$(CPU_ENV) $(PY) launcher/ablation.py --data data/python-stdlib --out runs/ablation

# The looped scaling law at CPU scale (#26, docs/evaluation.md): 27 tiny iso-depth RecurrentGPT runs
# (1 + r x (4/r) + 1, r in {1, 2, 4}, widths 32/48/64, three FLOPs budgets) through the real trainer,
# then rgpt-eval phi into runs/phi/fit. A pipeline check with its interval, not a measurement of phi.
phi: vocab  ## the looped scaling law's iso-depth sweep at CPU scale, and the fit of phi
	test -f data/python-stdlib/manifest.json || \
	  .venv/bin/rgpt prep python-stdlib --out data/python-stdlib --seq-len 128 --workers 2
	$(CPU_ENV) $(PY) launcher/phi.py --data data/python-stdlib --out runs/phi

# The RLT paper's length-generalisation protocol at CPU scale (#24, docs/algorithmic.md): parity and
# swaps-S5, the Transformer baseline, seeds 42/43/44; each run trains (rgpt-algo train, 1 process),
# then its best-validation-loss checkpoint is evaluated on the task's whole test grid (rgpt-algo eval),
# and rgpt-algo table writes runs/algorithmic/table/{table.md,table.json,accuracy_vs_length.png}.
# The two tasks run side by side (one process each, one core each). Reductions from the paper's recipe
# (configs/algorithmic/*.yaml), all in ALGO_CPU: the model rlt-transformer-debug (width 128, 4 layers,
# FFN 341, instead of width 512, 8 layers, FFN 1,365), 400 steps instead of 2,000, a global batch of 64
# instead of 512 (25,600 examples per run instead of 1,024,000), warm-up 40 steps, peak lr 1e-3 and
# final 5e-5 instead of 1e-4 and 5e-6 (20:1 as the paper; a short run needs the larger step),
# validation and checkpoints every 50 steps instead of 100, and the evaluation scores the first 256
# of the 1,024 test sequences at each length of the grid (ALGO_EVAL; 256 is the whole validation set).
# Unchanged: the data and the validation and test sequences, fp32, AdamW 0.9/0.95, weight decay 0.1,
# clip 1, per-example loss, selection by the minimum validation loss, the whole test length grid.
ALGO_RUNS := runs/algorithmic
ALGO_CPU  := train.max_steps=400 train.global_batch_size=64 train.micro_batch_size=32 train.warmup_steps=40 \
             train.lr=1e-3 train.min_lr=5e-5 eval.every_steps=50 checkpoint.every_steps=50 log.wandb=disabled
ALGO_EVAL := --limit 256
ALGO_TASK = for seed in 42 43 44; do run=$(ALGO_RUNS)/$(1)-rlt-transformer-debug-s$$seed; \
	  $(CPU_ENV) $(PY) launcher/algo.py train $(1) --model rlt-transformer-debug --seed $$seed --out $$run --nproc 1 \
	    $(ALGO_CPU) > $$run.log 2>&1 && $(CPU_ENV) $(PY) launcher/algo.py eval $$run $(ALGO_EVAL) >> $$run.log 2>&1 \
	    || { echo "$(1) seed $$seed failed: see $$run.log"; exit 1; }; echo "$(1) seed $$seed done"; done
algorithmic: venv  ## parity and s5_swaps with the debug Transformer, three seeds each: train, evaluate, table
	mkdir -p $(ALGO_RUNS)
	($(call ALGO_TASK,parity)) & a=$$!; ($(call ALGO_TASK,s5_swaps)) & b=$$!; wait $$a; ra=$$?; wait $$b && test $$ra = 0
	$(PY) launcher/algo.py table $(ALGO_RUNS)/{parity,s5_swaps}-rlt-transformer-debug-s4[234]/eval/eval.json \
	  --out $(ALGO_RUNS)/table

# The RLT paper's headline at CPU scale (#25, docs/families.md "CPU scale: make rlt"): parity trained
# on 3-16 bits (data.task_train_max=16; the paper: 3-40) and tested to 256, RLT-1 at two splits (2+2,
# 3+1), RLT-0 2+2 and the Transformer (4 layers), width 128, seeds 42 and 43; two lanes of one process
# each. Every model runs muP at m = 1 (mup_base_width = its width), as the paper's width-512 models do:
# the debug flavours' m = 1/4 multiplies the hidden lr by 4, and RLT-1 then never leaves ln 2. Each run's
# last checkpoint is evaluated: validation (32-40 bits) lies outside this training range, so it does not
# choose one. Reductions besides: 450 steps of 256 examples (115,200; the paper 2,000 of 512), warm-up
# 40, peak lr 1e-3 to 5e-5, the first 256 of the 1,024 test sequences per length.
RLT_RUNS := runs/rlt
RLT_CPU  := data.task_train_max=16 train.max_steps=450 train.global_batch_size=256 train.micro_batch_size=256 \
            train.warmup_steps=40 train.lr=1e-3 train.min_lr=5e-5 eval.every_steps=450 checkpoint.every_steps=450 \
            checkpoint.keep_best=false log.wandb=disabled model.mup_base_width=128
RLT_RUN = run=$(RLT_RUNS)/parity-$(1)-s$(2); \
	$(CPU_ENV) $(PY) launcher/algo.py train parity --model $(3) --seed $(2) --out $$run --nproc 1 $(RLT_CPU) $(4) \
	  > $$run.log 2>&1 && $(CPU_ENV) $(PY) launcher/algo.py eval $$run --checkpoint last --limit 256 >> $$run.log 2>&1 \
	  || { echo "parity $(1) seed $(2) failed: see $$run.log"; exit 1; }; echo "parity $(1) seed $(2) done"
RLT_LANE = $(call RLT_RUN,rlt1-2+2,$(1),rlt-debug,) && $(call RLT_RUN,rlt1-3+1,$(2),rlt-debug,model.n_enc=3 model.n_dec=1) \
	&& $(call RLT_RUN,rlt0-2+2,$(1),rlt-debug,model.feedback_interval=0) \
	&& $(call RLT_RUN,transformer-4,$(2),rlt-transformer-debug,)
rlt: venv  ## the RLT parity study at CPU scale (about 20 minutes)
	mkdir -p $(RLT_RUNS)
	($(call RLT_LANE,42,43)) & a=$$!; ($(call RLT_LANE,43,42)) & b=$$!; wait $$a; ra=$$?; wait $$b && test $$ra = 0
	$(PY) launcher/algo.py table $(RLT_RUNS)/parity-*-s4[23]/eval-last/eval.json --out $(RLT_RUNS)/table

# Silent-thinking depth recurrence at CPU scale (#28, docs/thinking.md): the graph-reachability task,
# thinking-graph-debug (width 64, FFN 128; the authors' width 128, FFN 256), seeds 42 and 43 side by
# side (one process each), 3,000 steps of 64 examples (192,000; the authors' 40 epochs of 12,000 are
# 7,480 steps), everything else the authors' recipe (configs/thinking/graph.yaml). Each run's last
# checkpoint is scored over the authors' grid (hops 1-12 x steps 1-20, 500 examples per hop count)
# and rgpt-think table writes runs/thinking/table/{table.md,table.json,frontier_*.png}.
THINK_RUNS := runs/thinking
THINK_CPU  := train.max_steps=3000 eval.every_steps=500 checkpoint.every_steps=500 log.wandb=disabled
THINK_RUN = run=$(THINK_RUNS)/graph-debug-s$(1); \
	$(CPU_ENV) $(PY) launcher/think.py train graph --model thinking-graph-debug --seed $(1) --out $$run $(THINK_CPU) \
	  > $$run.log 2>&1 && $(CPU_ENV) $(PY) launcher/think.py frontier $$run >> $$run.log 2>&1 \
	  || { echo "graph seed $(1) failed: see $$run.log"; exit 1; }; echo "graph seed $(1) done"
thinking: venv  ## the silent-thinking graph task's frontier at CPU scale (about 5 minutes)
	mkdir -p $(THINK_RUNS)
	($(call THINK_RUN,42)) & a=$$!; ($(call THINK_RUN,43)) & b=$$!; wait $$a; ra=$$?; wait $$b && test $$ra = 0
	$(PY) launcher/think.py table $(THINK_RUNS)/graph-debug-s4[23]/frontier/frontier.json --out $(THINK_RUNS)/table

bench: vocab  ## the CPU benchmarks (model, data, training and tensor-parallel throughput)
	$(PY) benchmarks/model_throughput.py
	$(PY) benchmarks/data_throughput.py
	$(CPU_ENV) $(PY) benchmarks/train_throughput.py
	$(CPU_ENV) $(PY) benchmarks/tensor_parallel.py

configs: venv  ## regenerate configs/models and configs/experiments from the specs and grids
	$(PY) -c "from rgpt_dist.models.flavours import write_yaml; write_yaml('configs/models')"
	$(PY) -c "from rgpt_dist.config.experiments import write_yaml; write_yaml('configs/experiments')"
	$(PY) -c "from rgpt_dist.config.ablations import write_yaml; write_yaml('configs/experiments')"
	$(PY) -c "from rgpt_dist.config.phi_sweep import write_yaml; write_yaml('configs/experiments')"
	$(PY) -c "from rgpt_dist.config.rt_grid import write_yaml; write_yaml('configs/experiments')"

# Re-resolve every pin after changing pyproject.toml's dependencies (keeps torch at the CPU wheel).
lock:  ## re-resolve constraints.txt after changing pyproject.toml's dependencies
	rm -rf /tmp/rgpt-lock && python3 -m venv /tmp/rgpt-lock
	/tmp/rgpt-lock/bin/pip install --quiet -c <(echo torch==2.13.0) -e '.[test]'
	/tmp/rgpt-lock/bin/pip uninstall --quiet -y torchvision
	{ sed -n '/^#/p' constraints.txt; echo torch==2.13.0; /tmp/rgpt-lock/bin/pip freeze --exclude-editable | grep -v -E '^torch(vision)?=='; echo torchvision==0.28.0; } > constraints.new && mv constraints.new constraints.txt

clean:  ## remove .venv and build outputs
	rm -rf .venv build *.egg-info .pytest_cache
