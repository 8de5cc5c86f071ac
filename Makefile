# The quick start: `make demo` and `make test`. Each target installs what it needs, idempotently.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Reinstalled whenever pyproject.toml changes.
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit system-deps bench bench-quick clean helm otelcol dist

# Each step says what it installs (a cold install is a minute or two of pip's quiet work); setuptools'
# "Editable installation" notice, a boxed warning about an editable install working as designed, is left out.
QUIET_BUILD := PYTHONWARNINGS='ignore:Editable installation'
$(STAMP): pyproject.toml
	@echo "make: setting up $(VENV) (once, and again when pyproject.toml changes)"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "make: updating pip, setuptools and wheel in $(VENV)"
	@$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel
	@echo "make: installing otel-ofu (editable) with its dependencies and its dev tools (pytest, mypy, ruff, ...)"
	@$(QUIET_BUILD) $(BIN)/python -m pip install --quiet -e '.[dev]'
# The producer benchmark's peer, without its own pins (see the dev extra in pyproject.toml).
	@echo "make: installing openlit, the producer benchmark's peer"
	@$(BIN)/python -m pip install --quiet --no-deps 'openlit>=1.45,<2'
	@touch $(STAMP)
	@echo "make: $(VENV) is ready"

# The demo's own light environment: otel-ofu and its runtime dependencies only (what `pip install otel-ofu`
# installs), not the dev tools and benchmark peers of $(VENV). Reinstalled when pyproject.toml changes.
DEMO_VENV := .venv-demo
DEMO_STAMP := $(DEMO_VENV)/.installed
$(DEMO_STAMP): pyproject.toml
	@echo "make: setting up $(DEMO_VENV) for the demo (once, and again when pyproject.toml changes)"
	@test -x $(DEMO_VENV)/bin/python || $(PYTHON) -m venv $(DEMO_VENV)
	@echo "make: installing otel-ofu (editable) and its runtime dependencies only into $(DEMO_VENV)"
	@$(QUIET_BUILD) $(DEMO_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -e .
	@touch $(DEMO_STAMP)
	@echo "make: $(DEMO_VENV) is ready"

demo: $(DEMO_STAMP)
	@echo "make: otel-ofu demo (a simulated fleet through the real producer, OTLP and collector)"
	@$(DEMO_VENV)/bin/otel-ofu demo

# System packages and npm clients some end-to-end tests use (Chromium, Prometheus, Node OTLP client).
system-deps:
	bash tests/setup/install-system-deps.sh

# The real helm CLI for the chart tests (tests/test_helm_chart.py), built from its Go module once.
helm:
	@command -v helm >/dev/null 2>&1 || bash tests/setup/build-helm.sh

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

# otel-ofu's OpenTelemetry Collector distribution and telemetrygen (collector/otelcol/builder/manifest.yaml),
# for the end-to-end tests; rebuilt only when missing or the manifest changed.
OTELCOL := build/otelcol/otelcol-ofu
$(OTELCOL): collector/otelcol/builder/manifest.yaml collector/otelcol/build.sh
	bash collector/otelcol/build.sh

otelcol:
	bash collector/otelcol/build.sh

test: $(STAMP) system-deps helm $(OTELCOL) lint typecheck unit bench-quick

bench: $(STAMP)
	$(BIN)/python -m benchmarks

bench-quick: $(STAMP)
	$(BIN)/python -m benchmarks --quick --strict

# The sdist and the wheel built from it (python -m build), as PyPI would serve them, into dist/.
dist: $(STAMP)
	$(BIN)/python -m build --outdir dist .

clean:
	rm -rf $(VENV) $(DEMO_VENV) .pytest_cache .mypy_cache .ruff_cache build dist *.egg-info
