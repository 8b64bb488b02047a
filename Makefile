# gpt-serve: `make demo` launches the demo on the shipped model; `make test` runs the test suite.
# Both create .venv and install everything (torch pinned by constraints.txt) on first use, and onnxruntime-web for
# the in-browser page (`npm ci` in demo/web, pinned by its package-lock.json).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt
STAMP := $(VENV)/.installed
WEB := demo/web
NODE_STAMP := $(WEB)/node_modules/.installed

.PHONY: install demo test test-fast lint bench clean

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

demo: $(STAMP) $(NODE_STAMP)
	$(PY) -m demo $(DEMO_ARGS)

test: $(STAMP) $(NODE_STAMP)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest $(PYTEST_ARGS)

test-fast: $(STAMP) $(NODE_STAMP)
	$(PY) -m pytest -m "not slow and not browser and not distributed" $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/onnx_generation.py --threads 2
	$(PY) benchmarks/training.py --threads 2 --presets shakespeare-cpu

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache $(WEB)/node_modules
