# The README's two set-up commands: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: test install-dev install-bench lint typecheck layers pytest reliability bench demo clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip "setuptools>=77" wheel

# A regular (non-editable) install, so the tests see exactly what a wheel ships.
install-dev: $(BIN)/python
	rm -rf build flowvault.egg-info
	$(PIP) install --no-build-isolation ".[dev,postgres]"
	$(PIP) install --no-build-isolation --no-deps --force-reinstall .
	rm -rf build flowvault.egg-info

lint: install-dev
	$(BIN)/ruff check .

typecheck: install-dev
	$(BIN)/mypy --strict \
		-p flowvault.domain -p flowvault.application -p flowvault.adapters -p flowvault.composition
	MYPYPATH=benchmarks $(BIN)/mypy --strict benchmarks/*.py

layers: install-dev
	$(BIN)/pytest -q -p no:cacheprovider tests/test_layers.py

pytest: install-dev
	$(BIN)/pytest

test: lint typecheck layers pytest

# The long reliability runs (thousands of kills, power cuts and tamper trials);
# prints the figures table. `make test` runs the same families at CI size.
# RELIABILITY_TESTS picks families (e.g. tests/reliability/test_tamper_matrix.py);
# figures are appended to RELIABILITY_REPORT, so a long run can be done in parts.
RELIABILITY_REPORT ?= reliability-figures.jsonl
RELIABILITY_TESTS ?= tests/reliability
reliability: install-dev
	RELIABILITY_PROFILE=long RELIABILITY_REPORT=$(abspath $(RELIABILITY_REPORT)) \
		$(BIN)/pytest -p no:cacheprovider -m reliability $(RELIABILITY_TESTS)
	$(BIN)/python tests/reliability/report.py $(RELIABILITY_REPORT)

# The bench extra: LangGraph's SQLite checkpointer and pycryptodome, the peer
# that S1, S2 and S5a measure flowvault against (without it they say so).
install-bench: install-dev
	rm -rf build flowvault.egg-info
	$(PIP) install --no-build-isolation ".[bench]"
	rm -rf build flowvault.egg-info

# The benchmark suite (minutes; never part of `make test`, which runs only its
# --quick smoke test). BENCH_ARGS passes options, e.g. BENCH_ARGS="--only S1,S2";
# ASYNC_BENCH_ARGS those of the async mechanisms' comparison (docs/async.md).
BENCH_OUT ?= bench-results.json
bench: install-bench
	$(BIN)/python benchmarks/run.py --out $(BENCH_OUT) $(BENCH_ARGS)
	$(BIN)/python benchmarks/async_mechanisms.py $(ASYNC_BENCH_ARGS)

# The main job: install flowvault and run an approval workflow end to end in a
# fresh SQLite home (a new temporary directory; DEMO_ARGS="--home DIR" to choose).
DEMO_ARGS ?=
demo: $(BIN)/python
	rm -rf build flowvault.egg-info
	$(PIP) install --no-build-isolation .
	rm -rf build flowvault.egg-info
	$(BIN)/flowvault demo $(DEMO_ARGS)

clean:
	rm -rf build dist flowvault.egg-info .mypy_cache .pytest_cache .ruff_cache
