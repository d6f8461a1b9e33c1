# Set-up is part of every target: a fresh clone needs only python3 (3.11) and make.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_LOG ?= fixtures/logs/cases/megatron/ecc_error.log

.PHONY: install demo serve test test-postgres bench bench-agent fixtures

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

test: install
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python -m bench.filter_bench

bench-agent: install
	$(BIN)/python -m bench.failure_agent_bench

fixtures: install
	$(BIN)/python -m fixtures.logs.generate cases
