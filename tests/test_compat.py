"""Every touch of a framework's private API lives in that framework's compat module (issue 32):
``ckptdash/lightning/compat.py`` (Lightning and Fabric) and ``ckptdash/dash/compat.py``
(Panel, Bokeh, Tornado, pyviz_comms, ipykernel). A walk over the package's syntax tree fails
on any other module that reads a private attribute ckptdash does not define itself
(``obj._name``, ``getattr(obj, "_name")``), imports a framework's private module or name, or
reads a call stack (``inspect.currentframe``, ``f_locals``), unless it is on the allow-list
below with its reason. The compat modules must say which releases they were written for, and
pyproject's lower bounds must be the releases ``make test-compat`` installs.

Costs about a second (parsing the package once).
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from packaging.version import Version

ROOT: Final = Path(__file__).resolve().parents[1]
PACKAGE: Final = ROOT / "ckptdash"
COMPAT: Final = ("lightning/compat.py", "dash/compat.py", "train/tracking/wandb_compat.py")

_NAMEDTUPLE: Final = {"_fields", "_replace", "_asdict", "_make"}  # namedtuple's public API
_FRAME_READS: Final = {"currentframe", "_getframe", "f_locals", "f_back", "f_globals"}

ALLOWED: Final[dict[tuple[str, str], str]] = {
    ("cli/__init__.py", "_SubParsersAction"): "argparse, the standard library: not a framework",
    ("train/checkpoints/artifacts.py", "_metadata"): (
        "torch's Module.state_dict() OrderedDict attribute, only tested for presence"
    ),
    ("train/ending/exit_status.py", "_exit"): "os._exit, the standard library's: not a framework",
}


@functools.cache
def _trees() -> dict[str, ast.Module]:
    return {
        path.relative_to(PACKAGE).as_posix(): ast.parse(path.read_text())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and not name.endswith("_")


def _literal_attr(node: ast.AST) -> str | None:
    """The name in ``getattr/hasattr/setattr/delattr(obj, "_name", ...)``, else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"getattr", "hasattr", "setattr", "delattr"}
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[1].value
    return None


def _on_self(node: ast.Attribute) -> bool:
    value = node.value
    if isinstance(value, ast.Name) and value.id in {"self", "cls"}:
        return True
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "super"
    )


def _own_names(trees: dict[str, ast.Module]) -> set[str]:
    """The private names ckptdash's own classes define (members, ``self._x = ...``), outside
    the compat modules; names starting ``_ckptdash`` are ckptdash's markers on other objects."""
    own: set[str] = set()
    for rel, tree in trees.items():
        if rel in COMPAT:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        own.add(item.name)
                    targets = item.targets if isinstance(item, ast.Assign) else []
                    if isinstance(item, ast.AnnAssign):
                        targets = [item.target]
                    own |= {t.id for t in targets if isinstance(t, ast.Name)}
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in {"self", "cls"}
            ):
                own.add(node.attr)
    return {name for name in own if _private(name)}


def _framework_names(trees: dict[str, ast.Module]) -> set[str]:
    """The private names the compat modules touch on the frameworks' objects: never ckptdash's
    own anywhere else, whatever ckptdash calls its own attributes."""
    names: set[str] = set()
    for rel in COMPAT:
        for node in ast.walk(trees[rel]):
            if isinstance(node, ast.Attribute) and not _on_self(node) and _private(node.attr):
                names.add(node.attr)
            literal = _literal_attr(node)
            if literal is not None and _private(literal):
                names.add(literal)
    return names - {"_ckptdash"}


def _touches(trees: dict[str, ast.Module]) -> Iterator[tuple[str, int, str]]:
    """(module, line, what) for each touch of a private framework API outside compat."""
    own, framework = _own_names(trees), _framework_names(trees)

    def foreign(name: str, on_self: bool) -> bool:
        if not _private(name) or name.startswith("_ckptdash") or name in _NAMEDTUPLE:
            return False
        return name not in own or (not on_self and name in framework)

    for rel, tree in trees.items():
        if rel in COMPAT:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                if node.attr in _FRAME_READS:
                    yield rel, node.lineno, f"reads a call stack (.{node.attr})"
                elif foreign(node.attr, _on_self(node)):
                    yield rel, node.lineno, node.attr
            elif (literal := _literal_attr(node)) is not None and foreign(literal, False):
                yield rel, node.lineno, literal
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.startswith(("ckptdash", "__future__")):
                    continue
                if any(_private(part) for part in node.module.split(".")):
                    yield rel, node.lineno, f"imports {node.module}"
                for alias in node.names:
                    if _private(alias.name):
                        yield rel, node.lineno, f"imports {node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if any(_private(part) for part in alias.name.split(".")):
                        yield rel, node.lineno, f"imports {alias.name}"


def test_framework_internals_are_touched_only_in_the_compat_modules() -> None:
    """No module outside ``lightning/compat.py`` and ``dash/compat.py`` reads a framework's
    private attribute, module or call stack, unless the allow-list says why."""
    found = [
        f"ckptdash/{rel}:{line}: {what}"
        for rel, line, what in _touches(_trees())
        if (rel, what) not in ALLOWED
    ]
    assert not found, (
        "a framework's private API outside its compat module (move the touch into a function"
        " of ckptdash/lightning/compat.py or ckptdash/dash/compat.py, saying what it touches"
        " and what happens without it):\n  " + "\n  ".join(found)
    )


def test_the_allow_list_names_only_touches_that_exist() -> None:
    """An allow-list entry whose touch is gone is removed, so that the list stays the truth."""
    seen = {(rel, what) for rel, _, what in _touches(_trees())}
    stale = sorted(set(ALLOWED) - seen)
    assert not stale, f"allow-list entries with nothing left to allow: {stale}"


def test_the_walk_finds_the_touches_it_is_meant_to() -> None:
    """The check itself: a private attribute of a framework object, a call-stack read, a
    private import and a ``getattr`` by name are each found; ckptdash's own are not."""
    source = (
        "import inspect\n"
        "from lightning.pytorch.trainer import _states\n"
        "class Mine:\n"
        "    def __init__(self):\n"
        "        self._own = 1\n"
        "def f(server, trainer, mine):\n"
        "    server._tornado\n"
        "    getattr(trainer, '_checkpoint_connector', None)\n"
        "    inspect.currentframe().f_back\n"
        "    return mine._own\n"
    )
    tree = ast.parse(source)
    trees = {"example.py": tree, **{rel: _trees()[rel] for rel in COMPAT}}
    what = {w for _, _, w in _touches(trees)}
    assert what == {
        "imports lightning.pytorch.trainer._states",
        "_tornado",
        "_checkpoint_connector",
        "reads a call stack (.currentframe)",
        "reads a call stack (.f_back)",
    }


_REQUIREMENT: Final = re.compile(r'"([A-Za-z0-9_.-]+)>=([0-9][0-9.]*)')
_PIN: Final = re.compile(r"^([A-Za-z0-9_.-]+)==([0-9][0-9.]*)\s*$")


def _pins() -> dict[str, str]:
    lines = (ROOT / "constraints-compat.txt").read_text().splitlines()
    return {m[1].lower(): m[2] for line in lines if (m := _PIN.match(line.strip()))}


def _lower_bounds() -> dict[str, str]:
    """Every ``"name>=version"`` requirement in pyproject.toml (dependencies and extras)."""
    text = (ROOT / "pyproject.toml").read_text()
    return {m[0].lower(): m[1] for m in _REQUIREMENT.findall(text)}


def test_pyproject_lower_bounds_are_the_versions_test_compat_runs() -> None:
    """``make test-compat`` installs constraints-compat.txt: each framework pinned there is
    pinned at pyproject's lower bound, so the oldest release ckptdash admits is one it ran."""
    pins, bounds = _pins(), _lower_bounds()
    frameworks = {"lightning", "transformers", "accelerate", "panel", "bokeh"}
    assert frameworks <= set(pins), f"constraints-compat.txt lacks {frameworks - set(pins)}"
    wrong = {name: (bounds.get(name), pins[name]) for name in frameworks}
    wrong = {
        n: pair
        for n, pair in wrong.items()
        if pair[0] is None or Version(pair[0]) != Version(pair[1])
    }
    assert not wrong, f"pyproject's bound vs constraints-compat.txt's pin: {wrong}"
    assert pins["torch"] == "2.13.0", "test-compat runs the one torch the project pins"


def test_each_compat_module_names_the_releases_it_was_written_for() -> None:
    """Each compat module's docstring names its lower bound (the release test-compat runs)."""
    pins = _pins()
    expected = {
        "lightning/compat.py": f"Lightning {pins['lightning']}",
        "dash/compat.py": f"Panel {pins['panel']}",
    }
    for rel, versions in expected.items():
        doc = ast.get_docstring(ast.parse((PACKAGE / rel).read_text())) or ""
        assert versions in doc, f"ckptdash/{rel}: its docstring should name {versions}"
