# Two commands do all the set-up on a fresh machine:
#   make demo   - create .venv, install ckptdash, run the demo
#   make test   - create .venv, install ckptdash with test extras, run lint, types and every test tier
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ckptdash-installed

.PHONY: setup system demo test lint types bench clean

$(STAMP): pyproject.toml constraints-dev.txt
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints-dev.txt -e '.[test,lightning]'
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

test: system lint types
	$(VENV)/bin/pytest

bench: setup
	$(PY) benchmarks/run.py $(ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
