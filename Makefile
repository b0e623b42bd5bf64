PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-fast check-wheel demo bench lint format typecheck clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# torch is pinned and installed first so that nothing pulls a CUDA build.
$(STAMP): $(BIN)/python pyproject.toml
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev,bench]'
	touch $(STAMP)

install: $(STAMP)

# The whole suite: the single-process tests on every core (one file per worker, so module
# fixtures are built once), then the multi-process Flower federations alone (their round
# timeouts assume the cores are theirs).
test: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist loadfile -m "not flower"
	$(BIN)/python -m pytest -m flower

# The developer's lane: everything but the multi-second end-to-end (slow) and multi-process
# Flower (flower) tests; a few minutes on 2 cores. CI runs `make test` (the whole suite).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not flower"

# What `pip install pdpfl` gives a user: build the sdist and the wheel (from the sdist; no
# deprecation warning from the package metadata), install the wheel with no extras into a bare
# virtual environment (torch first, as the README says; pip's cache serves both installs), and
# run every example for one round (plain and secure aggregation, ULDP-FL's private weighting),
# `pdpfl privacy`, `account` and `calibrate`, and each extra's refusal (tests/wheel_smoke.py).
WHEEL_VENV := build/wheel-venv
DATA_DIR ?= ../shared/data
check-wheel: $(STAMP)
	rm -rf dist $(WHEEL_VENV) build/wheel-smoke
	mkdir -p build
	$(BIN)/python -m build --outdir dist . > build/check-wheel-build.log 2>&1 \
		|| { cat build/check-wheel-build.log; exit 1; }
	@if grep -i -n "deprecat" build/check-wheel-build.log; then \
		echo "error: python -m build: deprecation warning above (build/check-wheel-build.log)"; \
		exit 1; fi
	$(PY) -m venv $(WHEEL_VENV)
	$(WHEEL_VENV)/bin/pip install -q torch==2.13.0
	$(WHEEL_VENV)/bin/pip install -q dist/pdpfl-*.whl
	$(WHEEL_VENV)/bin/python tests/wheel_smoke.py --examples examples --data-dir $(DATA_DIR) \
		--work build/wheel-smoke

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

# The formatter policy: `ruff format` (line length 100, pyproject.toml); CI checks it in `make lint`.
format: $(STAMP)
	$(BIN)/ruff format src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

demo: $(STAMP)
	$(BIN)/pdpfl compare examples/digits_demo.yaml --methods rpdp minimum dropout privacy-free --seeds 42 \
		--out runs/digits_demo --force

# Each script prints one JSON object; numbers, commands and the machine are in benchmarks/RESULTS.md.
BENCHMARKS := accounting calibration gdp_mechanisms dpsgd data federated flower pld secure_sum uldp \
	validation discrete_noise
bench: $(STAMP)
	@for b in $(BENCHMARKS); do echo "== benchmarks/$$b.py"; $(BIN)/python benchmarks/$$b.py --json || exit 1; done

clean:
	rm -rf $(VENV) build dist *.egg-info src/*.egg-info .pytest_cache
