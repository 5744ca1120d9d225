"""Every example in a docstring runs (issue 32, point 3): each module's doctests are run from a
folder holding the sample run ``runs/exp1`` (``ckptdash.write_sample_run``), the path the
examples use, and must pass; only the modules listed in :data:`LIVE` may skip examples, each
for the reason given there."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import ckptdash

PKG = Path(ckptdash.__file__).parent

LIVE = {
    "ckptdash.train.monitor": "needs a training loop with its model and Monitor",
    "ckptdash.train.checkpoints.async_save": "needs a Monitor saving in the background",
    "ckptdash.dash.app": "shows a widget in a running notebook",
    "ckptdash.dash.feed.follow": "follows a run while a job writes it",
    "ckptdash.state.runset": "follows the runs of a folder while jobs write them",
    "ckptdash.dash.server": "serves the dashboard on a port",
    "ckptdash._dev.testing": "starts `ckptdash serve` and a browser page",
    "ckptdash.tail": "polls a log while a job appends to it",
    "ckptdash.control": "claim(): answers commands from inside a training job",
}
"""Modules whose examples need a live job, a server or a browser: they are marked +SKIP."""


def _with_examples() -> list[str]:
    names = []
    for path in sorted(PKG.rglob("*.py")):
        if ">>>" not in path.read_text():
            continue
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        names.append(".".join(parts))
    return names


@pytest.mark.parametrize("name", _with_examples())
def test_the_examples_of_each_module_run(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The module's examples pass against the sample run; none is skipped unless the module
    is in LIVE, and a LIVE module does skip (else it belongs out of the list)."""
    monkeypatch.chdir(tmp_path)
    ckptdash.write_sample_run("runs/exp1")
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    skipped = 0
    for test in doctest.DocTestFinder().find(module):
        test.globs.setdefault("ckptdash", ckptdash)
        skipped += sum(1 for e in test.examples if e.options.get(doctest.SKIP))
        runner.run(test)
    assert runner.failures == 0, f"{name}: {runner.failures} example(s) failed (output above)"
    assert (skipped > 0) == (name in LIVE), (name, skipped)
