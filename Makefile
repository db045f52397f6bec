# rgpt-dist: `make test` (what CI runs) and `make quickstart` work on a fresh machine.
# Everything installs into .venv, resolved against constraints.txt (torch pinned to the CPU wheel).
SHELL   := /bin/bash
PY      := .venv/bin/python
PIP     := $(PY) -m pip
STAMP   := .venv/.installed
export PYTHONHASHSEED := 0

.PHONY: venv vocab test test-fast quickstart bench configs lock clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	# PyPI's torchvision (pulled by mosaicml-streaming) cannot load beside CPU torch.
	$(PIP) uninstall --quiet -y torchvision 2>/dev/null || true
	touch $(STAMP)

# The GPT-2 vocabulary, verified by sha256, into ~/.cache/rgpt-dist (from PyPI's openai-whisper sdist).
vocab: venv
	.venv/bin/rgpt-prep --fetch-vocab

test: vocab
	$(PY) -m pytest -q

test-fast: vocab
	$(PY) -m pytest -q -m "not slow"

# The main job on the embedded default arrives with the trainer (issue #4); until then this prints
# the parameter/FLOPs table of every flavour, prepares the embedded corpus and runs a short
# forward/backward benchmark of the debug models.
quickstart: vocab
	.venv/bin/rgpt-flops
	.venv/bin/rgpt-prep python-stdlib --out data/python-stdlib --seq-len 256 --workers 2 --overwrite
	$(PY) benchmarks/model_throughput.py --quick

bench: vocab
	$(PY) benchmarks/model_throughput.py
	$(PY) benchmarks/data_throughput.py

configs: venv
	$(PY) -c "from rgpt_dist.config.flavours import write_yaml; write_yaml('configs/models')"

# Re-resolve every pin after changing pyproject.toml's dependencies (keeps torch at the CPU wheel).
lock:
	rm -rf /tmp/rgpt-lock && python3 -m venv /tmp/rgpt-lock
	/tmp/rgpt-lock/bin/pip install --quiet -c <(echo torch==2.13.0) -e '.[test]'
	/tmp/rgpt-lock/bin/pip uninstall --quiet -y torchvision
	{ sed -n '/^#/p' constraints.txt; echo torch==2.13.0; /tmp/rgpt-lock/bin/pip freeze --exclude-editable | grep -v -E '^torch(vision)?=='; echo torchvision==0.28.0; } > constraints.new && mv constraints.new constraints.txt

clean:
	rm -rf .venv build *.egg-info .pytest_cache
