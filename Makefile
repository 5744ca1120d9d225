# Two commands do all the set-up on a fresh machine:
#   make demo   - create .venv, install ckptdash, run the demo
#   make test   - create .venv, install ckptdash with test extras, run lint, types and every test tier
# and one is the contributor's quick loop:
#   make check  - lint, types and the unit tests only (no process, browser or scheduler): about
#                 a minute on 2 cores; run `make test` before you push
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ckptdash-installed

.PHONY: setup system demo test check test-compat lint types bench clean

# The unit tests: every tier marker left out (pyproject.toml names them; tests/not_unit.txt
# marks the unmarked tests that start a process or take seconds). CKPTDASH_UNIT_ONLY=1 fails
# a selected test that starts a process anyway, naming the line to add.
UNIT := not (integration or slurm or gridengine or ui or notebook or process or slow)

$(STAMP): pyproject.toml constraints-dev.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints-dev.txt -e '.[train,test,lightning]'
	touch $@

setup: $(STAMP)

# Debian packages for the SLURM and browser tiers (installed when root; CI runs as root).
system:
	bash scripts/setup-system.sh

demo: setup
	$(VENV)/bin/ckptdash demo $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

types: setup
	$(VENV)/bin/mypy

# Three pytest-xdist workers on two cores: a worker waits on a scheduler, a browser or a job
# much of its time, and with two the cores idled a third of a run (docs/testing.md). The real
# clusters' tests (tests/slurm, then tests/gridengine) stay on one worker, and so do the
# two-account tests (tests/conftest.py, worker_group). WORKERS=0 runs them in one process.
WORKERS ?= 3

# compileall first: where PYTHONDONTWRITEBYTECODE is set (CI images often set it), every
# process the suite starts would compile ckptdash's modules again (~0.4 CPU-s a process that
# imports the dashboard and the Lightning callback); it writes only what changed.
test: system lint types
	$(PY) -m compileall -q -j 0 ckptdash tests
	$(VENV)/bin/pytest -n $(WORKERS) --dist loadgroup

check: lint types
	CKPTDASH_UNIT_ONLY=1 $(VENV)/bin/pytest -q -n 2 -m "$(UNIT)" --durations=10

# The Lightning, HF/Accelerate and Panel tests against pyproject's lower bounds
# (constraints-compat.txt) in a venv of their own, .venv-compat; not part of `make test`: run it
# when a change touches ckptdash/lightning/, the framework doors or ckptdash/dash/
# (docs/architecture.md, "Framework internals").
test-compat:
	bash scripts/test-compat.sh $(ARGS)

bench: setup
	$(PY) benchmarks/run.py $(ARGS)

clean:
	rm -rf $(VENV) .venv-compat .pytest_cache .mypy_cache .ruff_cache
