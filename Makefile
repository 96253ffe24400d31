# Two commands set everything up on a fresh clone (only Python 3.11 needed):
#   make demo   - the embedded reproduction (no downloads beyond package registries)
#   make test   - the test suite
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# Offline by design: hub look-ups fail at once instead of retrying.
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: demo study check-results test test-all bench gpu-check venv clean

venv: $(STAMP)

# Reinstalled whenever the dependency list or the pins change.
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $(STAMP)

# The demo: configs/study/demo_*.yaml, one seed of AdamW, HAM and HORST (<= 15 min on 2 cores): results/demo/
demo: $(STAMP)
	$(PY) scripts/embedded_study.py --demo

# The embedded study: configs/study/embedded_*.yaml through Hydra's multirun, resumable from
# results/embedded/runs.csv; refuses a dirty tree and runs of other code: results/embedded/
study: $(STAMP)
	$(PY) scripts/embedded_study.py

# Rerun seed 0 of one cell per pipeline and compare with results/embedded/runs.csv
check-results: $(STAMP)
	$(PY) scripts/embedded_study.py --check

# pytest-xdist: one test process per core (the subprocess-heavy tests wait on each other's
# imports and polls; on 2 cores the suite takes about half the time of one process).
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS)

test-all: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m ''

bench: $(STAMP)
	$(PY) bench/optimizer_step.py | tee results/bench/optimizer_step.txt
	$(PY) bench/pruning.py | tee results/bench/pruning.txt
	$(PY) bench/train_step.py --threads 1 | tee results/bench/train_step.txt

# On a GPU machine: every CUDA path once (<= 8 min), report in results/bench/gpu.md
gpu-check: $(STAMP)
	$(PY) bench/gpu_check.py

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
