"""What users are taught to import: the notebooks and every code block of the README and docs/
use only ckptdash's public modules, and the read API answers what the CLI answers."""

from __future__ import annotations

import json
import pkgutil
import re
from pathlib import Path

import pytest

import ckptdash
from ckptdash.cli import main

ROOT = Path(__file__).resolve().parents[1]

PUBLIC = {
    "ckptdash",
    "ckptdash.accelerate",
    "ckptdash.control",
    "ckptdash.dash",
    "ckptdash.dcp",
    "ckptdash.deepspeed",
    "ckptdash.events",
    "ckptdash.fabric",
    "ckptdash.hf",
    "ckptdash.lightning",
    "ckptdash.submitit",
}
"""The supported modules (``ckptdash/__init__.py`` says why each); everything else may move."""

_IMPORT = re.compile(r"^\s*(?:from\s+(ckptdash[\w.]*)\s+import|import\s+(ckptdash[\w.]*))", re.M)
_ATTR = re.compile(r"\bckptdash((?:\.[a-z_]\w*)+)")
_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


def _code_of_notebook(path: Path) -> str:
    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def _code_of_markdown(path: Path) -> str:
    return "\n".join(_FENCE.findall(path.read_text()))


def _internal_modules(code: str) -> set[str]:
    """Every ckptdash module the code imports, or names as ``ckptdash.x.y``, that is not public."""
    named = {a or b for a, b in _IMPORT.findall(code)}
    submodules = {m.name for m in pkgutil.iter_modules(ckptdash.__path__)}
    for dotted in _ATTR.findall(code):
        first = dotted.strip(".").split(".")[0]
        # `ckptdash.hf.CkptDashCallback` names the public module ckptdash.hf and one of its
        # names; `ckptdash.goodput(...)` names a function of the package itself.
        if first in submodules:
            named.add("ckptdash." + first)
    return {m for m in named if m not in PUBLIC}


# docs/architecture.md maps the internal packages for contributors, on purpose.
TAUGHT = sorted(
    [
        *ROOT.glob("notebooks/*.ipynb"),
        ROOT / "README.md",
        *(p for p in ROOT.glob("docs/*.md") if p.name != "architecture.md"),
    ],
    key=lambda p: p.name,
)


@pytest.mark.parametrize("path", TAUGHT, ids=lambda p: p.name)
def test_what_users_are_taught_imports_only_public_modules(path: Path) -> None:
    """A notebook or a doc's code block that imports an internal module (``ckptdash.cli``,
    ``ckptdash.state.reading`` ...) teaches users a path that moves between releases."""
    code = _code_of_notebook(path) if path.suffix == ".ipynb" else _code_of_markdown(path)
    assert _internal_modules(code) == set(), f"{path.relative_to(ROOT)} imports internals"


def test_the_check_catches_an_internal_import() -> None:
    """The check itself: internal paths are caught, public ones pass."""
    assert _internal_modules("from ckptdash.cli import render_status") == {"ckptdash.cli"}
    assert _internal_modules("x = ckptdash.analysis.health.detect(s)") == {"ckptdash.analysis"}
    assert _internal_modules("import ckptdash\nckptdash.hf.CkptDashCallback('r')") == set()


def test_read_api_answers_what_the_cli_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``ckptdash.status``/``checkpoints``/``alerts`` give a notebook what ``ckptdash status`` and
    ``ckptdash health`` print for the same run."""
    run = ckptdash.write_sample_run(tmp_path / "sample")
    state = ckptdash.load_state(run)
    assert state.attempts
    text = ckptdash.status(run)
    assert f"run {state.run_id}" in text
    rows = ckptdash.checkpoints(run)
    assert len(rows) == len(state.checkpoints)
    steps = [r["step"] for r in rows if r["step"] is not None]
    assert steps == sorted(steps, reverse=True)  # newest first
    assert all(not r["path"].startswith("/") for r in rows if r["status"] == "saved")
    assert main(["status", str(run), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert sorted(a["kind"] for a in printed["alerts"]) == sorted(
        a.kind for a in ckptdash.alerts(run)
    )
