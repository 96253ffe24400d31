# Two commands set everything up on a fresh clone (only Python 3.11 needed):
#   make demo   - the embedded reproduction (no downloads beyond package registries)
#   make test   - the test suite
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
HS     := $(VENV)/bin/horst-sparse
STAMP  := $(VENV)/.installed

# Offline by design: hub look-ups fail at once instead of retrying.
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1

.PHONY: demo demo-reference lint study check-results fingerprint test test-slurm test-all bench gpu-check venv clean

venv: $(STAMP)

# Which torch the venv gets (in a fresh clone, or after make clean). Empty: constraints.txt's pins
# from the default index, a CUDA 13.0 build (NVIDIA driver >= 580). cu126 (or another CUDA tag
# PyTorch's index serves the pinned version for): the same torch and torchvision built for that
# CUDA, for a node whose driver predates CUDA 13. site: a venv over the interpreter's own torch (a
# cluster's module; PYTHON=its python), pinned as it is, so that nothing is installed over it.
# Either way everything else is pinned by requirements-no-torch.lock (requirements.lock without
# torch, torchvision and their CUDA wheels).
TORCH ?=
TORCH_INDEX := https://download.pytorch.org/whl
TORCH_PINS = $(shell grep -E '^torch(vision)?==' constraints.txt)
# the torch distributions the interpreter has, as pins
SITE_PINS := import importlib.metadata as m; print(*sorted(f"{d.name}=={d.version}" for d in m.distributions() if d.name in ("torch", "torchvision", "triton")), sep="\n")

# Reinstalled whenever the dependency list or the pins change.
$(STAMP): pyproject.toml constraints.txt requirements-no-torch.lock
ifeq ($(TORCH),)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev,pipelines]'
else ifeq ($(TORCH),site)
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -c '$(SITE_PINS)' > $(VENV)/site-torch.txt
	grep -q '^torch==' $(VENV)/site-torch.txt || { echo "make venv TORCH=site: $(PYTHON) has no torch; load the cluster's PyTorch (PYTHON=its python), or leave TORCH out" >&2; rm -rf $(VENV); exit 2; }
	$(PY) -m pip install --quiet -c $(VENV)/site-torch.txt -c requirements-no-torch.lock -e '.[dev,pipelines]'
else
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --extra-index-url $(TORCH_INDEX)/$(TORCH) -c requirements-no-torch.lock $(addsuffix +$(TORCH),$(TORCH_PINS))
	$(PY) -m pip install --quiet -c constraints.txt -c requirements-no-torch.lock -e '.[dev,pipelines]'
endif
	touch $(STAMP)

# The demo: configs/study/demo_*.yaml, one seed of AdamW, HAM and HORST on the study's benchmarks
# (<= 15 min on 2 cores), trained into outputs/demo/ (a second run resumes there), its report there,
# then each number beside the committed reference results/demo/ and whether it agrees
demo: $(STAMP)
	$(HS) study --demo

# The committed reference of the demo, results/demo/: only by this explicit command (clean tree)
demo-reference: $(STAMP)
	$(HS) study --demo --out results/demo

# The embedded study: configs/study/embedded_*.yaml through Hydra's multirun, resumable from
# results/embedded/runs.csv; refuses a dirty tree and runs of other code: results/embedded/
study: $(STAMP)
	$(HS) study

# The ledger (every recorded row and pick is its protocol version's, as registered: horst_sparse/study/ledger.py),
# then rerun HORST's last cell per pipeline and judge results/embedded/runs.csv by it: bit for bit where the
# record was made in the reproducible CPU mode, else 3 seeds against its seeds' spread (horst_sparse/study/check.py)
check-results: $(STAMP)
	$(PY) -m horst_sparse.study.ledger
	$(HS) study --check

# The bits of a short ViT and GPT-2 run in the reproducible CPU mode, written to results/fingerprint.json
# (clean tree); tests/test_fingerprint.py asks any other x86 CPU for the same bits
fingerprint: $(STAMP)
	$(HS) fingerprint --write

# pytest-xdist: one test process per core (the subprocess-heavy tests wait on each other's
# imports and polls; on 2 cores the suite takes about half the time of one process).
TEST_WORKERS ?= 2

test: $(STAMP) lint
	$(PY) -m pytest -q -n $(TEST_WORKERS) --durations=15

# One formatter and linter (ruff; its rules in pyproject.toml): part of make test, so of CI
lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

# The sweeps on the real SLURM test cluster (as root: bash scripts/slurm_cluster.sh install && ... start)
test-slurm: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m 'slurm and not slow'

test-all: $(STAMP)
	$(PY) -m pytest -q -n $(TEST_WORKERS) -m ''

bench: $(STAMP)
	$(PY) bench/optimizer_step.py | tee results/bench/optimizer_step.txt
	$(PY) bench/pruning.py | tee results/bench/pruning.txt
	$(PY) bench/train_step.py --threads 1 | tee results/bench/train_step.txt
	$(PY) bench/optimizer_step.py --case host-overhead --rounds 20 --steps 5 | tee results/bench/optimizer_step_host_overhead.txt
	$(PY) bench/imagenet_loader.py --workers 2 --rounds 5 | tee results/bench/imagenet_loader.txt

# On a GPU machine (~10 min on one H200): the CUDA tests (pytest -m gpu) and the benchmarks on
# the GPU, one report: results/bench/gpu.md, printed at the end. It fails, naming why, where CUDA does
# not work (the one line of horst_sparse.training.env.cuda_problem, before anything runs), where a gpu
# test fails or is skipped (a skip here is a check that did not run: pytest -rA lists it as SKIPPED),
# where a benchmark fails, and where bench/optimizer_step.py's table has a "(fast path)" row whose
# ratio (its fourth column from the right) is over the target its header states ("target <= X"),
# GPU_RATIO_TARGET where it states none, and where the GPT-2 pipeline's own step (bench/train_step.py:
# GPT-2 Small, compiled, bf16) has a model FLOPs utilisation under GPU_MFU_TARGET. The gpu tests
# prove each CUDA path: the compiled HORST step against the plain one (tests/test_horst_gpu.py), a
# resume on the fast path bit for bit, DDP over NCCL, FSDP2 in bf16, train_vit.py and train_gpt2.py
# end to end on device=cuda with compile=true (tests/test_gpu_paths.py).
GPU_REPORT := results/bench/gpu.md
GPU_RATIO_TARGET := 1.10
GPU_MFU_TARGET := 0.40
gpu-check: $(STAMP)
	@$(PY) -c 'import sys; from horst_sparse.training.env import cuda_problem; p = cuda_problem(); sys.exit(p and f"make gpu-check: no CUDA: {p}")'
	{ echo "# make gpu-check, $$(date -u +%Y-%m-%dT%H:%MZ), commit $$(git describe --always --dirty 2>/dev/null)"; \
	  echo; echo '```'; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; \
	  $(PY) -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)'; echo '```'; \
	  echo; echo "## pytest -m gpu"; echo; echo '```'; } > $(GPU_REPORT)
	failed=""; bench=$$(mktemp); \
	$(PY) -m pytest -m gpu -rA -q -p no:cacheprovider tests > $$bench 2>&1 || failed="$$failed, gpu tests failed"; \
	grep -q '^SKIPPED' $$bench && failed="$$failed, gpu tests skipped"; \
	cat $$bench >> $(GPU_REPORT); \
	{ echo '```'; echo; echo "## bench/optimizer_step.py --device cuda"; echo; echo '```'; } >> $(GPU_REPORT); \
	$(PY) bench/optimizer_step.py --device cuda > $$bench 2>&1 || failed="$$failed, bench/optimizer_step.py failed"; \
	cat $$bench >> $(GPU_REPORT); \
	awk -v target=$(GPU_RATIO_TARGET) '/target <= / { for (i = 1; i < NF; i++) if ($$i == "<=") target = $$(i + 1) } \
	  /\(fast path\)/ && $$(NF-3) + 0 > target + 0 { over = 1 } END { exit !over }' $$bench \
	  && failed="$$failed, a fast-path ratio of bench/optimizer_step.py is over its target"; \
	{ echo '```'; echo; echo "## bench/train_step.py --device cuda (GPT-2 Small, compiled, bf16 autocast)"; echo; } >> $(GPU_REPORT); \
	$(PY) bench/train_step.py --device cuda --layers 12 --width 768 --context 1024 --batch 16 \
	  --mfu-target $(GPU_MFU_TARGET) >> $(GPU_REPORT) 2>&1 \
	  || failed="$$failed, bench/train_step.py failed (an MFU under $(GPU_MFU_TARGET), or an error: see its output)"; \
	rm -f $$bench; cat $(GPU_REPORT); \
	if [ -n "$$failed" ]; then echo "make gpu-check failed: $${failed#, }" >&2; exit 1; fi

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
