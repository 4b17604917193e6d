# The two commands of the README. Each runs the idempotent set-up first.
.PHONY: setup demo test lint docs

VENV ?= .venv
PY := $(VENV)/bin/python
# Two xdist workers: the SGLang server tests run one at a time on one of them, the CRIU toy
# tests and the in-memory tests on the other (tests/conftest.py).
TEST_WORKERS ?= 2
# The set-up installs CRIU and SGLang, so a test that needs either fails here instead of
# skipping where it is missing (tests/_support.py; GPU tests still skip without a GPU).
REQUIRE ?= criu,sglang

setup:
	scripts/setup.sh all

demo: setup
	$(PY) -m coldsnap.cli demo

test: setup
	$(PY) -m ruff check coldsnap tests bench
	$(PY) -m coldsnap.cli docs --check
	COLDSNAP_REQUIRE=$(REQUIRE) $(PY) -m pytest -q -ra --durations=30 -n $(TEST_WORKERS) --dist loadgroup

lint:
	$(PY) -m ruff check coldsnap tests bench

docs:
	$(PY) -m coldsnap.cli docs
