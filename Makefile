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

# The studies (rgpt_dist/studies/<name>/: plan, cluster grid, report; `rgpt study list`). Each target
# prepares the embedded corpus where the study needs it, then runs `rgpt study NAME run`: the runs not
# finished (one log each in runs/<name>/<run>.log), then the report in runs/<name>. What each study
# reproduces, and how strongly: README.md and `rgpt study NAME --help`.
STUDY = $(CPU_ENV) .venv/bin/rgpt study
CORPUS = test -f data/python-stdlib/manifest.json || \
	  .venv/bin/rgpt prep python-stdlib --out data/python-stdlib --seq-len 128 --workers 2
compare: vocab  ## the six models of one scaled-down Table 1 cell and the report (13-19 min; results/compare)
	$(CORPUS)
	$(STUDY) compare run --data data/python-stdlib --out runs/compare

compare-long: vocab  ## compare at 10x the tokens, two seeds per model (hours; resumes; results/compare-long)
	$(CORPUS)
	$(STUDY) compare-long run --data data/python-stdlib --out runs/compare-long

compare-rt: vocab  ## the Recurrent Transformer against its dense partner, two seeds
	$(CORPUS)
	$(STUDY) rt-compare run --data data/python-stdlib --out runs/compare-rt

ablation: vocab  ## the paper's sequential component ablation at CPU scale (10-13 min; records in results/ablation)
	$(CORPUS)
	$(STUDY) ablation run --data data/python-stdlib --out runs/ablation

phi: vocab  ## the looped scaling law's iso-depth sweep at CPU scale, and the fit of phi (18 min; records in results/phi)
	$(CORPUS)
	$(STUDY) phi run --data data/python-stdlib --out runs/phi

algorithmic: venv  ## parity and s5_swaps, the debug Transformer, three seeds (8 min; records in results/algorithmic)
	$(STUDY) algorithmic run --out runs/algorithmic

rlt: venv  ## the RLT study at CPU scale, parity and swaps-S5, three seeds (79 minutes on 2 cores; records in results/rlt)
	$(STUDY) rlt run --out runs/rlt

thinking: venv  ## the silent-thinking graph task's frontier at CPU scale (records in results/thinking)
	$(STUDY) thinking run --out runs/thinking

bench: vocab  ## the CPU benchmarks (model, data, training and tensor-parallel throughput)
	$(PY) benchmarks/model_throughput.py
	$(PY) benchmarks/data_throughput.py
	$(CPU_ENV) $(PY) benchmarks/train_throughput.py
	$(CPU_ENV) $(PY) benchmarks/tensor_parallel.py

configs: venv  ## regenerate configs/models, and every study's cluster grid (configs/experiments, slurm/)
	$(PY) -c "from rgpt_dist.models.flavours import write_yaml; write_yaml('configs/models')"
	for s in compare ablation phi rt-compare; do .venv/bin/rgpt study $$s grid || exit 1; done

# Re-resolve every pin after changing pyproject.toml's dependencies (keeps torch at the CPU wheel).
lock:  ## re-resolve constraints.txt after changing pyproject.toml's dependencies
	rm -rf /tmp/rgpt-lock && python3 -m venv /tmp/rgpt-lock
	/tmp/rgpt-lock/bin/pip install --quiet -c <(echo torch==2.13.0) -e '.[test]'
	/tmp/rgpt-lock/bin/pip uninstall --quiet -y torchvision
	{ sed -n '/^#/p' constraints.txt; echo torch==2.13.0; /tmp/rgpt-lock/bin/pip freeze --exclude-editable | grep -v -E '^torch(vision)?=='; echo torchvision==0.28.0; } > constraints.new && mv constraints.new constraints.txt

clean:  ## remove .venv and build outputs
	rm -rf .venv build *.egg-info .pytest_cache
