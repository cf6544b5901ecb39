# make serve: set up on first use and serve on http://127.0.0.1:$(PORT)
# make test:  set up with test extras and run the whole suite
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PORT ?= 8000
# make test's pytest processes (pytest-xdist): a job's compile is mostly one thread, so two keep both
# of CI's cores busy
TEST_PROCESSES ?= 2
# The Raspberry Pi targets: g++-aarch64-linux-gnu cross-compiles, mmdebstrap (+ arch-test) builds the
# emulated boards' arm64 root file system, qemu-user-static runs them.
PI_DEBS := g++-aarch64-linux-gnu mmdebstrap arch-test qemu-user-static
# riscv64: built and shown, not run (no board): its cross compiler links the library
CROSS_DEBS := g++-riscv64-linux-gnu libc6-dev-riscv64-cross
SERVE_DEBS := bubblewrap graphviz g++ llvm-19 $(PI_DEBS) $(CROSS_DEBS)
# The tests start real Redis and PostgreSQL servers (the queue and store of several machines).
TEST_DEBS := $(SERVE_DEBS) chromium redis-server postgresql fonts-dejavu-core

.PHONY: serve test setup setup-test debs debs-test lint clean

serve: setup
	PORT=$(PORT) $(VENV)/bin/tvm-playground serve

test: setup-test
	$(VENV)/bin/ruff check webapp tests benchmarks
	$(VENV)/bin/lint-imports  # the layering contracts in pyproject.toml
	$(VENV)/bin/mypy  # the types, over webapp/ ([tool.mypy] in pyproject.toml)
	$(VENV)/bin/python -m pytest -ra -n $(TEST_PROCESSES) --dist loadfile $(PYTEST_ARGS)
	# the tests whose outcome depends on the instruction set, again as on an AVX2-only CPU (no AVX-512,
	# no VNNI): x86-host builds the x86-avx2 preset's code (webapp/targets/x86.py)
	if grep -qw avx2 /proc/cpuinfo; then PLAYGROUND_HOST_PRESET=x86-avx2 \
		$(VENV)/bin/python -m pytest -ra -m isa -n $(TEST_PROCESSES) --dist loadfile $(PYTEST_ARGS); fi

setup: debs $(VENV)/.installed
setup-test: debs-test $(VENV)/.installed-test

# Debian packages are installed only when running as root and only when missing.
debs:
	@bash scripts/install-debs.sh $(SERVE_DEBS)
debs-test:
	@bash scripts/install-debs.sh $(TEST_DEBS)

$(VENV)/.installed: pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	# torch first: the CPU build; any later "torch" requirement is then already satisfied
	$(VENV)/bin/pip install --quiet torch==2.13.0
	$(VENV)/bin/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(VENV)/bin/pip install --quiet -e '.[test]'
	touch $@

lint: setup-test
	$(VENV)/bin/ruff check webapp tests benchmarks
	$(VENV)/bin/ruff format --check webapp tests benchmarks
	$(VENV)/bin/mypy

clean:
	rm -rf $(VENV) data
