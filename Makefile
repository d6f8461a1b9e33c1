# Set-up is part of every target: a fresh clone needs only python3 (3.11) and make.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_LOG ?= fixtures/logs/cases/megatron/ecc_error.log
# the PostgreSQL run: each test makes its own database on this server (random name, dropped
# after); with no server there, that run is skipped with the reason
TEST_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/test

.PHONY: install demo serve test test-sqlite test-postgres bench load-bench fixtures

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, from the local CPU wheel: a range resolved later would pull CUDA builds
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/faultline diagnose $(DEMO_LOG)

serve: install
	$(BIN)/faultline serve

# the whole suite twice: on SQLite (the embedded default), then on PostgreSQL
test: install
	$(BIN)/python -m pytest
	FAULTLINE_TEST_DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/python -m pytest

test-sqlite: install
	$(BIN)/python -m pytest

test-postgres: install
	FAULTLINE_TEST_DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/python -m pytest

bench: install
	$(BIN)/python -m bench.filter_bench

load-bench: install
	$(BIN)/python -m bench.load_bench

fixtures: install
	$(BIN)/python -m fixtures.logs.generate cases
