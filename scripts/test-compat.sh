#!/usr/bin/env bash
# `make test-compat`: the Lightning, HF and Panel tests against the oldest releases that
# pyproject.toml admits (constraints-compat.txt), in a venv of their own (.venv-compat), so the
# lower bounds are versions that were run and not hopes. Not part of `make test`: run it when a
# change touches ckptdash/lightning/, the framework doors or ckptdash/dash/ (their compat
# modules above all).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${COMPAT_VENV:-.venv-compat}
PYTHON=${PYTHON:-python3}
start=$(date +%s)
test -x "$VENV/bin/python" || "$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c constraints-compat.txt)
# torch first and alone: with it in place the others never pull another build.
"${pip[@]}" torch
"${pip[@]}" '.[train]' lightning transformers accelerate panel bokeh \
    'pytest>=8' 'pytest-timeout>=2.3' 'hypothesis>=6.100'
"$VENV/bin/python" - <<'PY'
import importlib.metadata as md
for name in ("torch", "lightning", "transformers", "accelerate", "panel", "bokeh"):
    print(f"test-compat: {name} {md.version(name)}")
PY
# The source tree's ckptdash (pyproject's pythonpath), the installed one only brought the deps.
# Arguments replace the list (e.g. one file while fixing it).
if [ "$#" -eq 0 ]; then
    mapfile -t tests < <(grep -v -e '^#' -e '^$' tests/compat_tests.txt)
    set -- "${tests[@]}"
fi
status=0
"$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "not (slurm or ui or notebook)" "$@" || status=$?
echo "test-compat: $(( $(date +%s) - start )) s, pytest exit status $status"
exit "$status"
