"""The Grid Engine tier: one real one-host Son of Grid Engine cell for all of tests/gridengine.

The tier runs by default. tests/gridengine/start.sh starts sge_qmaster and sge_execd by pid,
no systemd (and in CI installs the Debian packages where they are missing, debconf preseeded,
the package scripts kept from starting daemons, as scripts/setup-system.sh does for `make
test`); tests/gridengine/stop.sh stops them when the tier's last test is done, passed or not.
Outside CI the tier skips only where the system part is missing (not root, the packages not
installed), saying how to enable it; with CI=true it fails instead: CI runs every tier. The
fixture takes /tmp/ckptdash-sge.lock itself, so a full-suite run and a local run of the tier
take turns on the machine's one cell.

Every scenario starts as soon as the cell is up, all at the same time (a thread each); each
test then asserts on its scenario's outcome.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
JOB = HERE / "jobs" / "ge_job.py"
SGE_ROOT, SGE_CELL = "/var/lib/gridengine", "default"
NOTIFY_S = 10
"""The queue's notify time: a job's warning signal comes this long before the kill."""
LOAD_REPORT_S = 10
"""execd's report interval (start.sh's SGE_LOAD_REPORT): a reschedule's kill order comes with
the next report."""
NOTIFY_WAIT_S = 120.0
"""Longest wait for a reschedule's notify (Cell.reschedule): seen 80 s late on a busy cell."""
_measured: dict[str, float] = {}
START_HELP = "see the output above and tests/gridengine/start.sh (run it by hand as root)"


PACKAGES = ("gridengine-master", "gridengine-exec", "gridengine-client")
INSTALLED = ("/usr/lib/gridengine/sge_qmaster", "/usr/lib/gridengine/sge_execd", "/usr/bin/qsub")
LOCK = Path("/tmp/ckptdash-sge.lock")
"""One cell per machine: every run of the tier takes this lock (``flock`` on it from a shell
is the same lock, shared with the run it starts)."""


def _unavailable(why: str, how: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"Grid Engine tier: {why}; CI runs every tier", pytrace=False)
    pytest.skip(f"Grid Engine tier skipped: {why}; to enable it, {how}")


def _missing_system() -> None:
    """Skip (fail in CI) where the cell cannot run: not root, or its packages absent outside
    CI (in CI start.sh installs them, as scripts/setup-system.sh does for `make test`)."""
    if os.geteuid() != 0:
        _unavailable("it needs root (the daemons, min_uid)", "run the tier as root")
    absent = [p for p in INSTALLED if not os.access(p, os.X_OK)]
    if absent and os.environ.get("CI") != "true":
        _unavailable(
            f"{absent[0]} is missing",
            f"run `bash scripts/setup-system.sh` as root (installs {', '.join(PACKAGES)})",
        )


def _holds_lock_already() -> bool:
    """Whether an inherited descriptor is the lock file (``flock LOCK pytest ...``): that
    lock is this run's own, and locking the file again would wait for ourselves."""
    for fd in Path("/proc/self/fd").iterdir():
        try:
            if os.readlink(fd) == str(LOCK):
                return True
        except OSError:
            continue
    return False


@contextlib.contextmanager
def cell_lock() -> Iterator[None]:
    """Hold the machine's Grid Engine lock (a full-suite run may start the tier beside a
    local one; both would use the one cell, and each one's stop.sh would end the other's
    jobs). Waits for the other run; no wait where ``flock`` already holds it for us."""
    if _holds_lock_already():
        yield
        return
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@dataclass
class Cell:
    """The running cell: ``q(...)`` runs one of its commands; ``submit`` a batch script."""

    env: dict[str, str]
    base: Path
    start_s: float = 0.0
    scripts: int = 0
    pushing: threading.Lock = field(default_factory=threading.Lock)
    settled: dict[str, threading.Event] = field(default_factory=dict)
    """Run name -> set once that run is past what a busy cell upsets: its reschedule got its
    notify (Cell.reschedule), its parallel rerun started (:meth:`settle`)."""

    def q(self, *argv: str, check: bool = True) -> str:
        proc = subprocess.run(
            list(argv), capture_output=True, text=True, env=self.env, timeout=60, check=False
        )
        out = (proc.stdout + proc.stderr).strip()
        if check and proc.returncode != 0:
            raise AssertionError(f"`{shlex.join(argv)}` exit {proc.returncode}: {out}")
        return out

    def submit(self, body: str, *options: str) -> str:
        """Submit a bash batch script (``body`` after the environment set-up); the job id."""
        self.scripts += 1
        script = self.base / f"job{self.scripts}.sh"
        script.write_text(
            "#!/bin/bash\n"
            f"export PYTHONPATH={shlex.quote(str(REPO))} CKPTDASH_NO_COLOR=1\n"
            f"PY={shlex.quote(sys.executable)}\nJOBPY={shlex.quote(str(JOB))}\n" + body
        )
        log = self.base / f"job{self.scripts}.log"
        return self.q("qsub", "-terse", "-j", "y", "-o", str(log), *options, str(script))

    def state(self, job: str) -> str | None:
        """The job's state column in qstat, or None once Grid Engine forgot it."""
        for line in self.q("qstat", "-u", "*").splitlines():
            cols = line.split()
            if len(cols) >= 5 and cols[0] == job.split(".")[0]:
                return cols[4]
        return None

    def wait(self, what: str, test: Callable[[], Any], timeout: float = 120.0) -> Any:
        """Poll ``test`` (a command's answer) until it is truthy; AssertionError on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = test()
            if got:
                return got
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")

    def reschedule(self, job: str, run: Path, push: Callable[[], Any] | None = None) -> Any:
        """``qmod -rj JOB`` (or ``push()``, which runs it), then wait for the job's notify (its
        ``signal_received``), one push at a time.

        Measured on this cell (Son of Grid Engine 8.1.9): the kill order of a reschedule comes
        with one of execd's reports, 0.5-10 s after the push on a quiet cell; while other jobs
        of the host start, end or exit 99 it came 30-80 s late or never (qmaster logged
        "rescheduling job N", execd nothing; the job, still ``Rr``, ran to its end and was not
        rerun). So the tier pushes while the cell is quiet (the scenarios fixture starts the
        other jobs once every push got its notify), the job's first run lasts until the notify
        (FAST_RERUN), and a push whose notify has not come after three reports is pushed again
        (a second ``qmod -rj`` of an ``Rr`` job was seen delivered within a second)."""
        with self.pushing:
            try:
                return self._push_until_notified(job, run, push)
            finally:
                self.settle(run)

    def settle(self, run: Path) -> None:
        """``run`` is past what a busy cell upsets: the other scenarios may start."""
        self.settled.setdefault(run.name, threading.Event()).set()

    def _push_until_notified(self, job: str, run: Path, push: Callable[[], Any] | None) -> Any:
        said = push() if push is not None else self.q("qmod", "-rj", job)
        since = pushed = time.time()
        deadline = time.monotonic() + NOTIFY_WAIT_S
        while time.monotonic() < deadline:
            if any(e["kind"] == "signal_received" and e["t"] >= since for e in events(run)):
                return said
            state = self.state(job)
            if state is None:
                return said  # ended: the scenario's own test says how
            if "r" in state and time.time() - pushed > 3 * LOAD_REPORT_S:
                said = push() if push is not None else self.q("qmod", "-rj", job)
                pushed = time.time()
            time.sleep(0.5)
        raise AssertionError(
            f"Grid Engine delivered no notify for job {job} within {NOTIFY_WAIT_S:.0f} s"
            f" of `qmod -rj`, pushed again every {3 * LOAD_REPORT_S} s (said: {said!r};"
            f" qstat state {self.state(job)})"
        )

    def running(self, job: str, timeout: float = 120.0) -> None:
        """Wait until qmaster has the job as running (``r``): a qmod -rj of a job it still
        has in transfer (``t``, seen for half a minute on a busy machine) was seen to lose its
        kill order (no notify, no kill, no rerun)."""
        self.wait(f"job {job} running (qstat r)", lambda: self.state(job) == "r", timeout)

    def gone(self, job: str, timeout: float = 300.0) -> None:
        try:
            self.wait(f"job {job} to end", lambda: self.state(job) is None, timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.context(job)}") from None

    def context(self, job: str) -> str:
        """What Grid Engine says about ``job`` and what execd logged lately, the processes of
        the cell's jobs: printed with a scenario that timed out."""
        execd = Path(SGE_ROOT) / SGE_CELL / "spool" / "execd"
        logs = sorted(Path("/var/spool/gridengine/execd").glob("*/messages")) or sorted(
            execd.glob("*/messages")
        )
        tail = "\n".join(logs[0].read_text(errors="replace").splitlines()[-25:]) if logs else ""
        ps = subprocess.run(
            ["ps", "-eo", "pid,ppid,stat,etimes,args", "--forest"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        jobs = "\n".join(
            line for line in ps.splitlines() if "sge_shepherd" in line or "job" in line
        )
        return (
            f"qstat: {self.state(job)}\n{self.q('qstat', '-j', job, check=False)[-3000:]}\n"
            f"execd messages (last 25 lines):\n{tail}\nprocesses:\n{jobs[-3000:]}"
        )

    def ckptdash(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {**self.env, "PYTHONPATH": str(REPO)}
        return subprocess.run(
            [sys.executable, "-m", "ckptdash", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
            start_new_session=True,  # as from a login shell: tests/slurm/harness.Cluster.ckptdash
        )


def events(run: Path) -> list[dict[str, Any]]:
    """Every event of the run, from every file, in time order."""
    out = []
    for path in sorted((run / "events").glob("*.jsonl")):
        out += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(out, key=lambda e: e["t"])


def kinds(run: Path, kind: str) -> list[dict[str, Any]]:
    return [e for e in events(run) if e["kind"] == kind]


def steps_reached(run: Path, step: int) -> Callable[[], bool]:
    """Whether the run's heartbeats/steps passed ``step`` (the job is training)."""
    return lambda: (
        (run / "events").is_dir() and any((e.get("step") or 0) >= step for e in events(run))
    )


@pytest.fixture(scope="package")
def sge_cell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cell]:
    """A running one-host cell; skipped (failed in CI) where it cannot run."""
    _missing_system()
    with cell_lock():
        yield from _running_cell(tmp_path_factory)


def _running_cell(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cell]:
    t0 = time.monotonic()
    env = {
        **os.environ,
        "SGE_SLOTS": "12",
        "SGE_NOTIFY": f"00:00:{NOTIFY_S:02d}",
        "SGE_LOAD_REPORT": f"00:00:{LOAD_REPORT_S:02d}",
        "SGE_ROOT": SGE_ROOT,
        "SGE_CELL": SGE_CELL,
    }
    try:
        proc = subprocess.run(
            ["bash", str(HERE / "start.sh")],
            capture_output=True,
            text=True,
            env=env,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired:
        _unavailable("start.sh did not finish in 600 s", START_HELP)
    if proc.returncode != 0:
        _unavailable(f"start.sh failed: {(proc.stdout + proc.stderr).strip()[-800:]}", START_HELP)
    base = tmp_path_factory.mktemp("sge")
    base.chmod(0o755)
    cell = Cell(env, base, start_s=time.monotonic() - t0)
    _measured["start_s"] = cell.start_s
    try:
        yield cell
    finally:
        subprocess.run(["bash", str(HERE / "stop.sh")], env=env, timeout=120, check=False)
        _measured["tier_s"] = time.monotonic() - t0


@dataclass
class Scenarios:
    """Each scenario runs on its own thread from the start; ``outcome`` waits for one."""

    cell: Cell
    pool: ThreadPoolExecutor
    running: dict[str, Future[Any]] = field(default_factory=dict)

    def outcome(self, name: str) -> Any:
        if name not in self.running:
            pytest.skip(f"Grid Engine scenario {name!r} not in CKPTDASH_GRIDENGINE_ONLY")
        return self.running[name].result(timeout=600)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what the tier cost (docs/gridengine.md quotes it)."""
    if "start_s" not in _measured:
        return
    tr = terminalreporter
    tr.section("Grid Engine tier: measured on the real scheduler")
    tr.write_line(f"cell start: {_measured['start_s']:.1f} s")
    if "tier_s" in _measured:
        tr.write_line(f"tier wall time, cell start to stop: {_measured['tier_s']:.0f} s")
