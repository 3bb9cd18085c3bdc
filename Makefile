# Conveniences over the README's commands. `make test` is what CI runs.
Q ?= Which magazine was started first, Arthur's Magazine or First for Women?

.PHONY: setup run test test-all lint format
setup:
	bash scripts/setup.sh
run: setup
	.venv/bin/prompt-r1 run "$(Q)"
test: setup
	.venv/bin/python -m pytest -n 2
test-all: setup  # the slow tests too (GPU and paid-API tests still need their markers)
	.venv/bin/python -m pytest -n 2 -m "not gpu and not llm_call"
lint:
	.venv/bin/ruff check prompt_r1 tests graphs && .venv/bin/ruff format --check prompt_r1 tests graphs && .venv/bin/lint-imports
format:
	.venv/bin/ruff check --fix prompt_r1 tests graphs && .venv/bin/ruff format prompt_r1 tests graphs
