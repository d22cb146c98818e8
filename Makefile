# One place for setup, the main job, lint and tests; .ci/run calls `make test`.
# Needs only Python 3.11 and make: everything else is installed into .venv from the lock files.

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
export DAGSTER_HOME := $(CURDIR)/.dagster_home
export DAGSTER_DISABLE_TELEMETRY := 1

.PHONY: setup setup-dev demo test test-ui docs lint format check-defs bench bench-spark bench-labels quality clean

# .venv/numba_cache: the venv's kernel cache, which every calpipe run from .venv uses
# (calpipe/numba_cache.py): make's commands and .venv/bin/calpipe share one cache.
$(VENV)/.runtime: requirements/runtime.lock pyproject.toml
	$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "calpipe needs Python 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements/runtime.lock
	$(BIN)/python -m pip install --quiet --no-deps -e .
	mkdir -p $(DAGSTER_HOME) $(VENV)/numba_cache && touch $@

$(VENV)/.dev: $(VENV)/.runtime requirements/dev.lock
	$(BIN)/python -m pip install --quiet -r requirements/dev.lock
	touch $@

setup: $(VENV)/.runtime          ## runtime + pipeline stack
setup-dev: $(VENV)/.dev          ## + test/lint tools and dev-only oracles

demo: setup                      ## set up, then run the main job on the embedded DuckDB default
	$(BIN)/calpipe demo

docs: setup-dev                  ## the documentation site (mkdocs.yml, docs/) into site/; any warning fails it
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: setup-dev
	$(BIN)/ruff check calpipe dagster_project tests benchmarks
	$(BIN)/ruff format --check calpipe dagster_project tests benchmarks

format: setup-dev
	$(BIN)/ruff format calpipe dagster_project tests benchmarks
	$(BIN)/ruff check --fix calpipe dagster_project tests benchmarks

check-defs: setup
	cd $(CURDIR) && $(BIN)/dg check defs

test: setup-dev lint docs        ## set up, lint, build the docs, run the whole test suite, smoke-run the benchmarks
	$(BIN)/pytest
	$(BIN)/python -m benchmarks.run --size smoke --repeat 1 --out $(VENV)/BENCHMARKS.smoke.md
	$(BIN)/python -m benchmarks.quality --size smoke --out $(VENV)/QUALITY.smoke.md
	$(BIN)/python -W ignore -m benchmarks.spark --size smoke --out $(VENV)/SPARK.smoke.md
	$(BIN)/python -W ignore -m benchmarks.label_night --size smoke --out $(VENV)/LABELS.smoke.md
	$(BIN)/python -m benchmarks.monitoring --size smoke --repeat 1 --out $(VENV)/MONITORING.smoke.md

test-ui: setup-dev               ## the 14-minute walk-through of the dagster UI (#37's Done-when), skipped by make test
	CALPIPE_UI_LONG=1 $(BIN)/pytest tests/dagster_project/test_ui_data.py

bench: setup-dev                 ## full benchmark suite (items 1-9, 13-16 + Venn-ABERS) -> BENCHMARKS.md
	$(BIN)/python -m benchmarks.run --size full --out BENCHMARKS.md

bench-spark: setup-dev           ## calpipe.spark vs one process, one 5M-event night (table for BENCHMARKS.md)
	$(BIN)/python -W ignore -m benchmarks.spark --size full

bench-labels: setup-dev          ## the label feed: a 10M-score + 10M-label night, a 60-night chain (table for BENCHMARKS.md)
	$(BIN)/python -W ignore -m benchmarks.label_night --size full

quality: setup-dev               ## forecast quality on real drifting streams vs the anchors -> QUALITY.md
	$(BIN)/python -m benchmarks.quality --size full --out QUALITY.md

clean:
	rm -rf $(VENV) site .pytest_cache .ruff_cache .hypothesis .dagster_home
