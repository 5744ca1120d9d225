"""Fixtures shared by the tests: a run directory, a wait-until helper, and the selection of
`make check` (the unit tests alone)."""

from __future__ import annotations

import functools
import multiprocessing.process
import os
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckptdash.rundir import RunDir

WaitUntil = Callable[..., None]


@pytest.fixture
def run_dir(tmp_path: Path) -> RunDir:
    """A run directory laid out as the training side creates it (events/, control/, run.json)."""
    rd = RunDir(tmp_path / "run")
    rd.ensure()
    return rd


WAIT_FLOOR_S = 60.0
"""The least a ``wait_until`` waits before it fails, whatever timeout the test asked for. A
timeout bounds a wait that will never end, it is not a window a passing test must fit: with a
CPU-bound process beside the suite, and the SLURM tier's 24 job sessions sharing the cores
with the worker's one, a redraw a test allowed 5 s for can take longer."""


def _wait_until(condition: Callable[[], object], timeout: float = 10.0, what: str = "") -> None:
    """Return once ``condition()`` is true; fail the test after ``timeout`` seconds, or
    :data:`WAIT_FLOOR_S` where that is longer."""
    bound = max(timeout, WAIT_FLOOR_S)
    deadline = time.monotonic() + bound
    pause = threading.Event()  # never set: wait() is only a short, interruptible pause
    for interval in poll_intervals():
        if condition():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {bound:.0f}s waiting for {what or condition}")
        pause.wait(interval)


def poll_intervals(first: float = 0.001, longest: float = 0.025) -> Iterator[float]:
    """Pauses between two looks at a condition: 1 ms, doubling to 25 ms. A condition that holds
    soon is seen within a millisecond; one that takes seconds (a training process starting) is
    not asked 1,000 times a second, which on two cores took CPU from the process it waits for."""
    interval = first
    while True:
        yield interval
        interval = min(interval * 2, longest)


@pytest.fixture
def wait_until() -> WaitUntil:
    """``wait_until(condition, timeout=10.0, what="")``: poll a condition instead of sleeping."""
    return _wait_until


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C reaches the processes the tests start. A shell without job control starts a
    background `make test &` with SIGINT ignored, and an ignored signal stays ignored across
    exec: every demo, launcher and worker the tests start would then ignore the Ctrl-C the
    tests press (three tests failed so, under `(make test &)`)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# --- `make check`: the unit tests alone ------------------------------------------------------
#
# `make check` runs the tests that start no process, drive no browser and need no scheduler
# (the quick loop: ruff, mypy and these in about a minute); `make test` runs everything. A test
# is a unit test unless a marker says otherwise; the folders below are whole tiers of real
# training, so their tests are marked here. With CKPTDASH_UNIT_ONLY=1 (set by `make check`) a
# unit test that starts a process anyway fails, naming the marker to add: the selection cannot
# drift from what it claims.

UNIT_ONLY = os.environ.get("CKPTDASH_UNIT_ONLY") == "1"
NOT_UNIT = ("integration", "slurm", "gridengine", "ui", "notebook", "process", "slow")
"""The markers `make check` leaves out (pyproject.toml's [tool.pytest.ini_options] says what
each means)."""
_TIER_FOLDERS = {
    "train": "integration",
    "frameworks": "integration",
    "slurm": "slurm",
    "gridengine": "gridengine",
    "notebooks": "notebook",
}
"""Folders of tests/ whose every test is one tier (real CPU training, a real scheduler, a real
kernel)."""


PROCESS_TEST_TIMEOUT_S = 600
"""pytest-timeout's bound for a test that starts processes (pyproject's 300 s stays for unit
tests). Every SLURM job is a session of its own, and Linux shares the CPU by session: while the
SLURM tier starts its 24 jobs, the other worker's whole session gets about a 25th of two cores,
and a 2-rank Accelerate test of 11 CPU-seconds took 177 s of wall in a CI run."""

_NOT_UNIT_LIST = Path(__file__).with_name("not_unit.txt")
"""Unmarked tests that are not unit tests: ``MARKER FILE`` or ``MARKER FILE::TEST`` a line."""


def _not_unit() -> dict[str, str]:
    """Test (or module) -> the marker not_unit.txt gives it."""
    lines = (line.split() for line in _NOT_UNIT_LIST.read_text().splitlines())
    return {where: marker for marker, where in (w for w in lines if w and w[0][0] != "#")}


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under `make check`, the tier folders and the modules not_unit.txt names whole are not even
    imported: their imports (transformers, nbformat, mlflow, DCP) were a third of the quick
    loop's time, for tests it deselects anyway."""
    if not UNIT_ONLY:
        return None
    try:
        rel = collection_path.relative_to(Path(__file__).parent.parent)
    except ValueError:
        return None
    if len(rel.parts) >= 2 and rel.parts[0] == "tests" and rel.parts[1] in _TIER_FOLDERS:
        return True
    return True if str(rel) in _not_unit() else None


# --- `make test`: two workers, one per real cluster ------------------------------------------

_ONE_WORKER = ("slurm", "gridengine")
"""Folders whose tests share one real cluster (fixed ports, one spool). Both folders are one
group, so one pytest-xdist worker runs them one after the other: each tier starts its scenarios'
jobs at once (24 SLURM jobs importing Lightning, 11 Grid Engine jobs importing torch), and the
two bursts together on two cores stretched a job's start past two minutes in a CI run: Grid
Engine's 30 s h_rt came before the job had started, and SLURM's scenarios timed out."""


@functools.cache
def _uses_accounts(module: Path) -> bool:
    """Whether a test module creates the extra Unix accounts (tests/security/accounts.py):
    the modules that do share those accounts, so one worker runs them all."""
    return module.is_file() and "accounts import" in module.read_text()


def worker_group(nodeid: str, root: Path) -> str:
    """The unit of work a worker takes whole: the real clusters' folders, the accounts modules,
    or else the test alone."""
    parts = nodeid.split("::", 1)[0].split("/")
    if len(parts) > 2 and parts[0] == "tests" and parts[1] in _ONE_WORKER:
        return "clusters"
    if _uses_accounts(root.joinpath(*parts)):
        return "accounts"
    return nodeid


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test` (``-n 2 --dist loadgroup``) groups tests by :func:`worker_group`.

    xdist's own loadgroup reads an ``@group`` suffix its worker appends to each test's node id;
    under pytest 9 that assignment no longer changes the id, so every group was split across
    both workers and two SLURM clusters started on the same ports. The groups are computed
    here, in the controller, from the node ids alone. Largest groups first (the clusters'),
    the rest one test at a time to whichever worker is free."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class FolderGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid, root)

    return FolderGroups(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    listed = _not_unit()
    for item in items:
        try:
            rel = Path(item.path).relative_to(here.parent)
        except ValueError:
            continue
        folder = rel.parts[1] if len(rel.parts) > 2 else ""
        if folder in _TIER_FOLDERS:
            item.add_marker(_TIER_FOLDERS[folder])
        name = getattr(item, "originalname", None) or item.name
        marker = listed.get(f"{rel}::{name}") or listed.get(str(rel))
        if marker:
            item.add_marker(marker)
        if item.get_closest_marker("timeout") is None and any(
            item.get_closest_marker(m) for m in NOT_UNIT
        ):
            item.add_marker(pytest.mark.timeout(PROCESS_TEST_TIMEOUT_S))


@pytest.fixture(autouse=True)
def _unit_tests_start_no_process(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under `make check`: a test that starts a process fails, saying which marker to add."""
    if not UNIT_ONLY or any(request.node.get_closest_marker(m) for m in NOT_UNIT):
        return
    node = request.node
    why = (
        f"{node.nodeid} starts a process, and `make check` runs unit tests only: add the line"
        f" {node.path.relative_to(Path(__file__).parent.parent)}::{node.originalname} to"
        f" {_NOT_UNIT_LIST.name} (or mark it @pytest.mark.process); `make test` runs it"
    )

    def refuse(*args: object, **kwargs: object) -> None:
        if threading.current_thread() is not threading.main_thread():
            # A background worker (the dashboard's scheduler thread asking scontrol) sees what
            # it sees on a machine without the program; the test itself stays a unit test.
            raise FileNotFoundError(why)
        pytest.fail(why, pytrace=False)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(os, "fork", refuse)


# --- Where the suite's CPU goes ----------------------------------------------------------------

CPU_REPORT = os.environ.get("CKPTDASH_TEST_CPU")
"""A file to which each test appends a line (docs/testing.md, "Where the suite's time goes"):
``CPU-seconds<TAB>wall-seconds<TAB>start (Unix time)<TAB>worker<TAB>node id``. The CPU is the
pytest process's and that of the processes it started and reaped during the test, set-up and
tear-down included; jobs a real scheduler runs are not its children and are not counted. The
start and the worker (pytest-xdist's ``gw0``, ``gw1``; ``-`` without workers) give the run's
timeline: which worker was busy with what, and when."""


def _cpu_seconds() -> float:
    mine = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not CPU_REPORT:
        yield
        return
    cpu, began, wall = _cpu_seconds(), time.time(), time.monotonic()
    yield
    worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
    line = (
        f"{_cpu_seconds() - cpu:.2f}\t{time.monotonic() - wall:.2f}\t{began:.1f}\t{worker}"
        f"\t{item.nodeid}\n"
    )
    with open(CPU_REPORT, "a") as report:  # one short append per test: workers do not interleave
        report.write(line)
