# The two commands of the README. Each runs the idempotent set-up first.
.PHONY: setup demo test lint docs

VENV ?= .venv
PY := $(VENV)/bin/python

setup:
	scripts/setup.sh all

demo: setup
	$(PY) -m coldsnap.cli demo

test: setup
	$(PY) -m ruff check coldsnap tests bench
	$(PY) -m coldsnap.cli docs --check
	$(PY) -m pytest -q -ra

lint:
	$(PY) -m ruff check coldsnap tests bench

docs:
	$(PY) -m coldsnap.cli docs
