# kvcxl: `make demo` runs the main job, `make test` runs every test (as CI does).
# Both set up everything they need on a fresh Debian 12/13 machine (run as root
# for the Debian packages; see README).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
CORE   := $(VENV)/.kvcxl-core
ALL    := $(VENV)/.kvcxl-all
PYTEST_ARGS ?=
# pytest workers (xdist): one per core, at most 4 (tests/conftest.py keeps a file on one worker)
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST  := -n $(JOBS) --dist loadfile

.PHONY: demo test test-fast lint setup system-deps clean

demo: $(CORE)
	$(BIN)/kvcxl demo

test: $(ALL) system-deps lint
	$(BIN)/kvcxl setup
	$(BIN)/python -m pytest -m "" $(XDIST) $(PYTEST_ARGS)

test-fast: $(ALL)
	$(BIN)/python -m pytest -m "not slow" $(XDIST) $(PYTEST_ARGS)

lint: $(ALL)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check common cxl firmware emu model experiments rtl tb qemu cli tests setup.py

setup: $(ALL) system-deps
	$(BIN)/kvcxl setup

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip setuptools wheel

# Installing includes compiling the fast engine's loops (numba, cached): the demo's first
# run then replays at once.
$(CORE): pyproject.toml setup.py | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e .
	$(BIN)/kvcxl setup --only engine
	touch $@

$(ALL): pyproject.toml setup.py | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[all]'
	touch $(CORE) $@

# Debian packages the tests use (Icarus Verilog; gdb, which reads a crashed QEMU's core).
SYSTEM_DEPS := iverilog gdb
system-deps:
	@missing=""; for p in $(SYSTEM_DEPS); do command -v $$p >/dev/null || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then echo "missing:$$missing: run 'apt-get install$$missing' as root" >&2; exit 1; fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
