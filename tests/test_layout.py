"""The package's shape holds without anyone remembering it: a folder per idea, small modules,
and no import cycle (imports only for type checking, and those inside functions, count too)."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "ckptdash"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out[".".join(parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The ckptdash modules ``path`` imports anywhere in it (``from pkg import submodule``
    counts as the submodule)."""

    def owner(name: str) -> str:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        return name if name in modules else ""

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ckptdash"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(full if full in modules else owner(node.module))
        elif isinstance(node, ast.Import):
            found |= {owner(a.name) for a in node.names if a.name.startswith("ckptdash")}
    return found - {""}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_cycle_not_even_for_type_checking() -> None:
    """No two ckptdash modules import each other, directly or round a loop, whether at import
    time, inside a function or under ``TYPE_CHECKING``: each floor imports only what lies below."""
    modules = _modules()
    graph = {name: _imports(path, modules) - {name} for name, path in modules.items()}
    assert _cycles(graph) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    """The check itself: a loop of three is one cycle; a chain is none."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


MAX_LINES = 500
LONG_FOR_ONE_IDEA: dict[str, str] = {
    "train/monitor.py": "one class, Monitor: the public surface of a plain loop, each method a"
    " few lines handing over to the engine, checkpoints/ and tracking/",
}
"""Modules (path under ``ckptdash/``) allowed past :data:`MAX_LINES`, each with its reason:
one idea that splitting would only scatter. The module says why at its top too (its
docstring names the limit: "over 500 lines"). The limit itself stays: a long module not on
this list fails."""


def _long_modules() -> dict[str, int]:
    return {
        p.relative_to(PKG).as_posix(): n
        for p in PKG.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }


def test_modules_stay_small_and_the_top_level_stays_a_front_door() -> None:
    """No module passes 500 lines (one that does usually holds two jobs) unless
    :data:`LONG_FOR_ONE_IDEA` says why, and at most 15 modules sit directly in ``ckptdash/``:
    everything else lives in the folder of its idea."""
    unexplained = {rel: n for rel, n in _long_modules().items() if rel not in LONG_FOR_ONE_IDEA}
    assert unexplained == {}, (
        f"modules over {MAX_LINES} lines: {unexplained}; split one that holds two ideas, or add"
        " it to LONG_FOR_ONE_IDEA with its reason and say why at its top"
    )
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 15, top


def test_a_long_module_says_why_at_its_top_and_the_list_stays_true() -> None:
    """Each exception to the line limit is over the limit still (else it leaves the list) and
    its docstring says why it is long ("over 500 lines")."""
    long = _long_modules()
    for rel, reason in LONG_FOR_ONE_IDEA.items():
        assert reason.strip(), rel
        assert rel in long, f"{rel} is no longer over {MAX_LINES} lines: remove it from the list"
        doc = ast.get_docstring(ast.parse((PKG / rel).read_text())) or ""
        assert f"over {MAX_LINES} lines" in doc, f"{rel}: say at its top why it is long"


def test_the_training_side_is_a_folder_per_idea() -> None:
    """``train/`` holds only its front door directly (``Monitor`` and ``TrainConfig``, which
    ``ckptdash`` re-exports); every other module lives in the folder of its idea (engine,
    starting, ending, checkpoints, tracking, health), and each folder says its idea at its top."""
    train = PKG / "train"
    assert sorted(p.name for p in train.glob("*.py")) == ["__init__.py", "config.py", "monitor.py"]
    for folder in (d for d in train.iterdir() if d.is_dir() and d.name != "__pycache__"):
        init = folder / "__init__.py"
        assert init.exists(), f"{folder} is not a package"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init}: say the folder's idea"


def test_the_training_side_and_the_dashboard_never_import_each_other() -> None:
    """``train/`` writes the run directory and ``dash/`` reads it: neither imports the other,
    so the dashboard never loads the training machinery and a job never loads Panel."""
    modules = _modules()
    for name, path in modules.items():
        deps = _imports(path, modules)
        if name.startswith("ckptdash.dash"):
            assert not {d for d in deps if d.startswith("ckptdash.train")}, name
        if name.startswith("ckptdash.train"):
            assert not {d for d in deps if d.startswith("ckptdash.dash")}, name


def test_the_login_node_side_never_imports_the_training_side() -> None:
    """``cli/`` and ``ops/`` act on a run from a login node (commands, settings, the scheduler)
    and never import ``train/``: what both sides need (e.g. the crash loop's author of a
    requeue suspension) lives below them, and an action does the same thing from the CLI, the
    dashboard and the notebook (``ops/actions.py``)."""
    modules = _modules()
    for name, path in modules.items():
        if name.startswith(("ckptdash.cli", "ckptdash.ops")):
            deps = _imports(path, modules)
            assert not {d for d in deps if d.startswith("ckptdash.train")}, name
