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

PUBLIC = set(ckptdash.PUBLIC_MODULES)
"""The supported modules: ckptdash's one list (``ckptdash/__init__.py`` says why each)."""

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


# docs/architecture.md maps the internal packages for contributors, on purpose, and
# docs/benchmarks.md names the fixtures the benchmarks build their runs with.
CONTRIBUTORS = {"architecture.md", "benchmarks.md"}
TAUGHT = sorted(
    [
        *ROOT.glob("notebooks/*.ipynb"),
        ROOT / "README.md",
        *(p for p in ROOT.glob("docs/*.md") if p.name not in CONTRIBUTORS),
    ],
    key=lambda p: p.name,
)


@pytest.mark.parametrize("path", TAUGHT, ids=lambda p: p.name)
def test_what_users_are_taught_imports_only_public_modules(path: Path) -> None:
    """A notebook or a doc's code block that imports an internal module (``ckptdash.cli``,
    ``ckptdash.state.reading`` ...) teaches users a path that moves between releases."""
    code = _code_of_notebook(path) if path.suffix == ".ipynb" else _code_of_markdown(path)
    assert _internal_modules(code) == set(), f"{path.relative_to(ROOT)} imports internals"


@pytest.mark.parametrize("path", [p for p in TAUGHT if p.suffix == ".md"], ids=lambda p: p.name)
def test_the_prose_of_the_docs_names_public_modules_only(path: Path) -> None:
    """Outside the code blocks too: a page that points users at ``ckptdash.ops.liveness``
    names a path that moves; it says what the public API or the CLI shows instead."""
    assert _internal_modules(path.read_text()) == set(), path.relative_to(ROOT)


def test_the_architecture_map_names_the_public_modules() -> None:
    """docs/architecture.md's list of supported modules is :data:`ckptdash.PUBLIC_MODULES`."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    intro = text[: text.index("## The flow")]
    named = set(re.findall(r"`(ckptdash(?:\.[a-z_]+)?)`", intro))
    assert named == PUBLIC


def test_what_the_read_api_returns_is_exported() -> None:
    """``load_state`` hands out a :class:`ckptdash.RunState`, ``alerts`` a list of
    :class:`ckptdash.Alert`, ``goodput`` a :class:`ckptdash.RunGoodput`: a user can name
    (and type) what they get without importing an internal module."""
    import typing

    hints = {f: typing.get_type_hints(getattr(ckptdash, f)) for f in ("load_state", "goodput")}
    assert hints["load_state"]["return"] is ckptdash.RunState
    assert hints["goodput"]["return"] is ckptdash.RunGoodput
    assert typing.get_type_hints(ckptdash.alerts)["return"] == list[ckptdash.Alert]
    assert {"RunState", "Alert", "RunGoodput"} <= set(ckptdash.__all__)


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


def test_the_read_api_writes_nothing_unless_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``load_state``, ``status``, ``checkpoints``, ``alerts`` and ``goodput`` are reads: on a
    run whose log is long enough for a snapshot (here: any log) they leave the run directory
    as it was; only ``load_state(run, write=True)`` leaves a snapshot behind."""
    from ckptdash.state import snapshot

    monkeypatch.setattr(snapshot, "SNAPSHOT_AFTER_BYTES", 0)
    run = ckptdash.write_sample_run(tmp_path / "exp1")

    def files() -> dict[str, int]:
        return {str(p.relative_to(run)): p.stat().st_mtime_ns for p in run.rglob("*")}

    before = files()
    ckptdash.load_state(run)
    ckptdash.status(run)
    ckptdash.checkpoints(run)
    ckptdash.alerts(run)
    ckptdash.goodput(run)
    assert files() == before
    ckptdash.load_state(run, write=True)
    assert any(p.startswith("snapshot") for p in set(files()) - set(before))
