"""The reader side installs without PyTorch (issue 32, point 10): ``pip install ckptdash`` —
no ``train`` extra — into a fresh virtual environment on a login node gives ``status``,
``watch`` and ``serve``, and none of them imports torch.

Offline and cheap: the fresh environment (``python -m venv``) sees exactly the distributions
that ckptdash's own requirements need — their closure, read from the installed packages'
metadata with the markers evaluated, linked in from this environment — and ckptdash itself
is installed into it by pip from this checkout (``--no-deps --no-index``). ``pip check`` then
proves the closure satisfies the package's requirements; torch, not in it, cannot be
imported there at all.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
import venv
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from ckptdash import events
from ckptdash.rundir.writer import EventWriter

pytestmark = pytest.mark.process  # a virtual environment, pip, and the installed command

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "reader-token-" + "r" * 24


def _closure(requirements: list[str]) -> set[str]:
    """The distributions these requirements pull in (no extras), by normalised name."""
    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in seen:
            continue
        seen.add(name)
        todo += [Requirement(r) for r in metadata.distribution(name).requires or []]
    return seen


def _link_closure(names: set[str], into: Path) -> None:
    """Every top-level file and folder of these distributions (and their metadata), linked
    into ``into``: an environment that holds them and nothing else."""
    into.mkdir()
    for name in names:
        dist = metadata.distribution(name)
        base = Path(str(dist.locate_file("")))
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            target = (base / top).resolve()
            if top in ("..", "__pycache__") or not target.exists() or (into / top).exists():
                continue
            (into / top).symlink_to(target)


def _reader_requirements() -> list[str]:
    """ckptdash's own requirements, and its build backend's (pip builds it here, offline)."""
    import tomllib

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needs = pyproject["project"]["dependencies"]
    assert not any(r.startswith("torch") for r in needs), needs
    return [*needs, *pyproject["build-system"]["requires"]]


@pytest.fixture(scope="module")
def reader_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding ckptdash without its ``train`` extra, and its requirements only."""
    base = tmp_path_factory.mktemp("reader")
    env = base / "env"
    venv.create(env, with_pip=False, symlinks=True)
    deps = base / "deps"
    _link_closure(_closure(_reader_requirements()), deps)
    site = next((env / "lib").glob("python3*/site-packages"))
    (site / "reader-deps.pth").write_text(f"{deps}\n")
    python = env / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "install", "--quiet", "--no-deps", "--no-index", "--no-build-isolation", str(ROOT)],
        check=True,
        timeout=300,
        cwd=base,
    )
    check = subprocess.run([*pip, "check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, check.stdout + check.stderr
    return env


def _run(env: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(env / "bin" / "ckptdash"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=check,
        cwd=env.parent,  # not this checkout: the installed package is the one imported
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )


def test_status_watch_and_serve_run_where_torch_is_not_installed(
    reader_env: Path, tmp_path: Path
) -> None:
    """In the fresh environment torch cannot be imported; ``status --json`` and ``watch
    --once`` read a run, and ``serve`` serves its page behind the token."""
    python = str(reader_env / "bin" / "python")
    probe = subprocess.run(
        [python, "-c", "import ckptdash, importlib.util as u; print(u.find_spec('torch'))"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        check=True,
    )
    assert probe.stdout.strip() == "None"
    run = tmp_path / "run"
    with EventWriter(run, attempt=0, host="n0") as w:
        w.emit(events.RunStarted, max_steps=10)
        w.emit(events.RunFinished, step=10, reason="completed")
    assert '"state": "finished"' in _run(reader_env, "status", str(run), "--json").stdout
    _run(reader_env, "watch", str(run), "--once")

    serve = subprocess.Popen(
        [str(reader_env / "bin" / "ckptdash"), "serve", str(run), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp_path,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "CKPTDASH_TOKEN": TOKEN},
    )
    try:
        assert serve.stdout is not None
        line = serve.stdout.readline()
        url = re.search(r"(http://\S+)", line)
        assert url is not None, line
        page = urllib.request.urlopen(
            urllib.request.Request(url.group(1), headers={"Authorization": f"token {TOKEN}"}),
            timeout=60,
        )
        assert page.status == 200
    finally:
        serve.terminate()
        serve.wait(30)
