# dedupsink — every target sets itself up: a fresh clone needs only Python 3.11, Java 17 and make
# (and npm for the test targets, which install the tests' Azure emulator; on Debian as root they
# install chromium too, for the report's browser test, and PostgreSQL, for the Iceberg SQL
# catalog's tests).
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
DEPS_STAMP := $(VENV)/.dependencies
STAMP := $(VENV)/.installed
# The package is installed as built (not editable): Spark's Python workers find the data source
# by listing the modules on their path, which an editable install's import hook hides. A change
# to a source file (or to the package data: the JSON Schemas) reinstalls it, in a few seconds.
SOURCES := pyspark_dedup.py $(shell find dedupsink \( -name '*.py' -o -name '*.json' \) -not -path '*/__pycache__/*')
AZURITE_STAMP := $(VENV)/azurite/.installed
CHROMIUM_STAMP := $(VENV)/.chromium
POSTGRES_STAMP := $(VENV)/.postgresql
# Microsoft's Azure Blob emulator, for the tests
AZURITE_VERSION := 3.37.0
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.DEFAULT_GOAL := help
.PHONY: help install lint format test test-fast test-slow test-all test-compat run bench clean

help: ## Show the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-10s %s\n", $$1, $$2}'

$(DEPS_STAMP): pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null 2>&1 || { echo "Python 3.11 is needed ($(PYTHON) not found; set PYTHON=...)"; exit 2; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt '.[dev,hdfs,test,delta,iceberg]'
	$(PY) tools/precompile_pyspark.py  # bytecode in PySpark's archive, as Spark's workers import it
	@touch $(DEPS_STAMP)

$(STAMP): $(DEPS_STAMP) $(SOURCES)
	@rm -rf build/lib build/bdist.*  # setuptools' copy keeps files the sources no longer have
	$(PY) -m pip install --quiet --no-deps --force-reinstall .
	@rm -rf build/lib build/bdist.* dedupsink.egg-info
	@touch $(STAMP)

# Only the tests use the emulator: `make run` works without npm.
$(AZURITE_STAMP): | $(STAMP)
	@command -v npm >/dev/null 2>&1 || { echo "npm is needed for the tests' Azure emulator"; exit 2; }
	npm install --silent --no-audit --no-fund --prefix $(VENV)/azurite azurite@$(AZURITE_VERSION)
	@touch $(AZURITE_STAMP)

# The report's test draws the page in a real browser: Debian's chromium, headless.
$(CHROMIUM_STAMP): | $(STAMP)
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" != 0 ]; then echo "chromium is needed for the tests (the report's browser test): install Debian's 'chromium' package (sudo apt-get install chromium)"; exit 2; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@touch $(CHROMIUM_STAMP)

# The Iceberg catalog tests run pyiceberg's SQL catalog on a real PostgreSQL: Debian's server, of
# which the tests start a throwaway cluster. Where it cannot be installed they are skipped.
$(POSTGRES_STAMP): | $(STAMP)
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then touch $(POSTGRES_STAMP); \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null && touch $(POSTGRES_STAMP); \
	else echo "note: the tests of the Iceberg SQL catalog on PostgreSQL will be skipped: install Debian's 'postgresql' package (sudo apt-get install postgresql)"; fi

install: $(STAMP) $(AZURITE_STAMP) ## Create .venv and install dedupsink with its dev tools and the tests' emulator

lint: $(STAMP) ## ruff (lint + format check) and mypy
	$(VENV)/bin/ruff check dedupsink tests bench tools pyspark_dedup.py
	$(VENV)/bin/ruff format --check dedupsink tests bench tools pyspark_dedup.py
	$(VENV)/bin/mypy

format: $(STAMP) ## Apply ruff's formatting and safe fixes
	$(VENV)/bin/ruff check --fix dedupsink tests bench tools pyspark_dedup.py
	$(VENV)/bin/ruff format dedupsink tests bench tools pyspark_dedup.py

test: $(STAMP) $(AZURITE_STAMP) $(CHROMIUM_STAMP) $(POSTGRES_STAMP) ## Everything but the slow tests, Spark and cluster tests included (under 15 minutes)
	$(PY) -m pytest -q -m "not slow"

test-fast: $(STAMP) ## Unit tests only: engine, store, cache, options (no Spark, no browser)
	$(PY) -m pytest -q -m "not spark and not cluster and not slow and not browser"

test-slow: $(STAMP) $(AZURITE_STAMP) $(CHROMIUM_STAMP) $(POSTGRES_STAMP) ## Only the slow fault, soak and scale tests (CI runs them after `make test`)
	$(PY) -m pytest -q -m slow || [ $$? -eq 5 ]  # 5: no slow test collected

test-all: $(STAMP) $(AZURITE_STAMP) $(CHROMIUM_STAMP) $(POSTGRES_STAMP) ## Everything, the slow tests too
	$(PY) -m pytest -q

# A venv per PySpark release under .venv-compat/ (the releases: tests/compat/versions.txt), made
# again only when pyproject.toml, constraints.txt or that list changed; pip's cache is shared.
test-compat: ## The smoke tests on the newest patch of each accepted PySpark minor version, and 4.0's refusal
	$(PYTHON) tools/compat.py

run: $(STAMP) ## Run the demo job (log dedup with 24 h tuple-time expiry) on the shipped sample data
	@$(PY) data/make_samples.py --touch  # Spark reads files by modification time: make it name order
	$(VENV)/bin/dedupsink run conf/system-logs.conf

bench: $(STAMP) ## Print the engine benchmark figures
	$(PY) bench/engine_bench.py

clean: ## Remove the venv, outputs and caches
	rm -rf $(VENV) .venv-compat out .pytest_cache .mypy_cache .ruff_cache build *.egg-info
