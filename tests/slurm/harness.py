"""The SLURM tier's harness: a real single-node cluster (start.sh/stop.sh) and real jobs on it.

:class:`Cluster` starts and stops the daemons and runs SLURM's commands with the cluster's
``SLURM_CONF``; :class:`Scenario` is one test's working folder with helpers to submit the
job scripts in ``jobs/`` with ``sbatch`` and to wait for conditions (never fixed sleeps);
:class:`Scenarios` runs the scenario drivers of a session in threads, all at once, so their
jobs share the cluster (the node has more CPUs than the machine has cores) and the tier
takes about as long as its longest scenario.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ckptdash.events import Event
from ckptdash.tail import RunTailer

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parents[1]
JOBS = HERE / "jobs"
ENABLE_HINT = (
    "to enable it: `sudo apt-get install slurmctld slurmd slurm-client munge`, then run the"
    " tests as root (`make test` does both)"
)
POLL_S = 0.1
ABORT = threading.Event()
"""Set when the session ends: every wait still running gives up at once."""
MEASUREMENTS: list[tuple[str, dict[str, float]]] = []
"""(what, figures in seconds) the tests measured, printed at the end of the session."""
FINISHED = frozenset(
    {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}
    | {"DEADLINE", "OUT_OF_MEMORY"}
)
"""Job states that end a job; all others (PENDING, RUNNING, COMPLETING, SIGNALING, ...) do not."""
DURATIONS: dict[str, float] = {}
"""Wall time of each scenario driver, in seconds."""
SETTLE_WAIT_S = 180.0
"""Longest hold on the other scenarios' start while a :func:`starts_first` scenario's job
starts."""


class ClusterUnavailable(Exception):
    """The daemons cannot run here; ``str()`` says why."""


def free_port() -> int:
    """A TCP port nobody listens on now (for a job's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A running SLURM under ``base`` (see start.sh): one node, or ``nodes`` of them."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.conf = base / "etc" / "slurm.conf"
        self.start_s = 0.0  # how long start.sh took
        self.env = {
            **os.environ,
            "SLURM_CONF": str(self.conf),
            # Jobs import this checkout's ckptdash and tests/ helpers whatever is installed.
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p
            ),
            "OMP_NUM_THREADS": "1",
        }
        for name in list(self.env):
            if name.startswith(("SLURM_", "CKPTDASH_")) and name != "SLURM_CONF":
                del self.env[name]  # the tests may themselves run inside a SLURM job

    @classmethod
    def start(cls, base: Path, cpus: int = 8, nodes: int | None = None) -> Cluster:
        """Run start.sh (``nodes``: that many nodes node1..nodeN, each slurmd in its own UTS
        namespace; None: this machine as the one node); ClusterUnavailable when the daemons
        cannot run here."""
        if os.geteuid() != 0:
            raise ClusterUnavailable(f"the SLURM tier needs root to run slurmd; {ENABLE_HINT}")
        env = {**os.environ, "SLURM_NODE_CPUS": str(cpus)}
        began = time.monotonic()
        cluster = cls(base)
        try:
            proc = subprocess.run(
                ["bash", str(HERE / "start.sh"), str(base), *([str(nodes)] if nodes else [])],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except subprocess.TimeoutExpired:
            cluster.stop()
            raise ClusterUnavailable(f"start.sh {base} took more than 120 s") from None
        cluster.start_s = time.monotonic() - began
        if proc.returncode == 3:  # start.sh says what is missing and how to install it
            raise ClusterUnavailable(f"{proc.stderr.strip()}, then run the tests as root")
        if proc.returncode != 0:
            cluster.stop()
            raise ClusterUnavailable(
                f"start.sh {base} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
                f"; {ENABLE_HINT}"
            )
        return cluster

    def stop(self) -> None:
        """Run stop.sh: cancel the cluster's jobs, stop the daemons by their pid files."""
        subprocess.run(
            ["bash", str(HERE / "stop.sh"), str(self.base)],
            env=self.env,
            capture_output=True,
            timeout=120,
            check=False,
        )

    def run(
        self, *argv: str, check: bool = True, timeout: float = 60.0, own_session: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """A command with this cluster's SLURM_CONF; raises with its output if check fails.

        ``own_session``: in a session of its own, as a command typed at a login shell (see
        :meth:`ckptdash`); otherwise in pytest's, as the harness's own polls.
        """
        proc = subprocess.run(
            list(argv),
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            start_new_session=own_session,
        )
        if check and proc.returncode != 0:
            out = (proc.stdout + proc.stderr)[-2000:]
            raise AssertionError(f"`{shlex.join(argv)}` exit {proc.returncode}: {out}")
        return proc

    def ckptdash(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """The ckptdash CLI as users run it, on the login node (same machine here).

        In a session of its own, as from a login shell. With the kernel's autogroup scheduling
        (on by default) each session shares the CPU equally with every other: left in pytest's
        session, a `ckptdash status` shared one share with every scenario thread's polls, while
        each of the tier's jobs (a session of its own) had a whole one, and took over 60 s
        while the tier's start kept both cores busy.
        """
        return self.run(sys.executable, "-m", "ckptdash", *args, check=check, own_session=True)

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (this harness's own parser, not ckptdash's)."""
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout.strip().splitlines()[0]
        fields: dict[str, str] = {}
        for token in out.split():
            key, sep, value = token.partition("=")
            if sep and key not in fields:
                fields[key] = value
        return fields

    def log_about(self, job: Job, n: int = 30) -> str:
        """slurmctld's last log lines that name the job (what it did, what it refused)."""
        base = job.job_id.split("_")[0]
        try:
            lines = (self.base / "log" / "slurmctld.log").read_text(errors="replace").splitlines()
        except OSError as exc:
            return f"(cannot read slurmctld.log: {exc})"
        mine = [line for line in lines if f"JobId={base}" in line or f" {base} " in line]
        return "\n".join(mine[-n:])

    def squeue(self, job_id: str) -> tuple[str, str] | None:
        """(state, reason) as squeue prints them; None once the job left the queue."""
        out = self.run("squeue", "-h", "-j", job_id, "-o", "%T|%r", check=False).stdout.strip()
        if not out:
            return None
        state, _, reason = out.splitlines()[0].partition("|")
        return state, reason


def start_tier(base: Path, tier: str, **options: Any) -> Cluster:
    """``Cluster.start(base, **options)`` for a test tier: where the daemons cannot run, the
    tier is skipped saying why and how to enable it — or fails, with CI=true."""
    try:
        return Cluster.start(base, **options)
    except ClusterUnavailable as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the SLURM tier must run in CI (CI=true), but: {exc}", pytrace=False)
        pytest.skip(f"{tier} skipped: {exc}")


def marked_drivers(session: pytest.Session, mark: str) -> list[Driver]:
    """The scenario drivers of the selected tests, as ``mark`` (an attribute) names them."""
    return [
        getattr(item.function, mark)  # type: ignore[attr-defined]
        for item in session.items
        if hasattr(getattr(item, "function", None), mark)
    ]


def wait_for(
    condition: Callable[[], Any],
    timeout: float,
    what: str,
    context: Callable[[], str] | None = None,
) -> Any:
    """Poll ``condition`` until it returns something true and return it; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if ABORT.is_set():
            raise AssertionError(f"gave up waiting for {what}: the test session is ending")
        if time.monotonic() > deadline:
            extra = f"\n{context()}" if context is not None else ""
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{extra}")
        time.sleep(POLL_S)


def read_events(run_dir: Path) -> list[Event]:
    """Every readable event of a run, ordered by time."""
    events = [e for b in RunTailer(run_dir).batches() for e in (*b.events, *b.pulses)]
    return sorted(events, key=lambda e: e.t)


@dataclass
class Job:
    """One submitted job: its id, where its output goes, where its per-attempt reports go."""

    job_id: str
    output: Path
    reports: Path
    script: Path

    def report(self, attempt: int, rank: int | None = None) -> dict[str, Any] | None:
        name = f"attempt-{attempt}" + ("" if rank is None else f".rank-{rank}") + ".json"
        try:
            data: dict[str, Any] = json.loads((self.reports / name).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return data

    def task(self, task: int) -> Job:
        """Array task ``task`` of this array job, as its own job (``ID_TASK``)."""
        return Job(
            f"{self.job_id}_{task}",
            Path(str(self.output).replace("%a", str(task))),
            Path(str(self.reports).replace("{array_task}", str(task))),
            self.script,
        )

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.output.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return f"(no job output at {self.output})"
        return "\n".join(lines[-n:])


@dataclass
class Scenario:
    """One scenario's folder on the shared filesystem, and the cluster it submits to."""

    cluster: Cluster
    root: Path
    name: str
    jobs: list[Job] = field(default_factory=list)
    runs: list[Path] = field(default_factory=list)
    settled: threading.Event = field(default_factory=threading.Event)
    """Set once the scenario's first job trains (:meth:`wait_training`) or the driver ended:
    a :func:`starts_first` scenario holds the others' start until then."""

    def sbatch(
        self,
        job_args: list[str],
        *options: str,
        srun: bool = False,
        array: bool = False,
        program: str = sys.executable,
    ) -> Job:
        """Submit ``python JOB_ARGS...`` (or ``PROGRAM JOB_ARGS...``, e.g. torchrun) as a batch
        job (exec'd, or under srun) with options.

        ``array``: the options hold ``--array``; logs and reports are per task.
        """
        n = len(self.jobs)
        script = self.root / f"job{n}.sh"
        launch = "srun --kill-on-bad-exit=0 " if srun else ""
        # exec: the batch step *is* Python, so --signal=B:... and scancel --batch reach it.
        script.write_text(
            f"#!/bin/bash\nexec {launch}{shlex.quote(program)} {shlex.join(job_args)}\n"
        )
        output = self.root / (f"job{n}-%A_%a.out" if array else f"job{n}-%j.out")
        proc = self.cluster.run(
            "sbatch",
            "--parsable",
            f"--job-name=ckptdash-{self.name}",
            f"--output={output}",
            "--open-mode=append",  # a requeued job appends to its log
            f"--chdir={self.root}",
            *options,
            str(script),
        )
        job_id = proc.stdout.strip().split(";")[0]
        reports = self.root / (f"reports{n}-{{array_task}}" if array else f"reports{n}")
        job = Job(
            job_id, Path(str(output).replace("%j", job_id).replace("%A", job_id)), reports, script
        )
        self.jobs.append(job)
        return job

    def lightning(
        self, run: Path, *options: str, max_steps: int, array: bool = False, **job_opts: Any
    ) -> Job:
        """Submit the Lightning job (tests/slurm/jobs/lightning_job.py) on run directory ``run``.

        ``array``: an array job (``--array`` in the options); ``run`` holds ``{array_task}``.
        """
        n = len(self.jobs)
        reports = self.root / (f"reports{n}-{{array_task}}" if array else f"reports{n}")
        args = [str(JOBS / "lightning_job.py"), str(run), str(reports)]
        args += ["--max-steps", str(max_steps), *_options(job_opts)]
        if not array:
            self.runs.append(run)
        return self.sbatch(args, *options, array=array)

    def monitor(
        self, run: Path, *options: str, max_steps: int, srun: bool = False, **job_opts: Any
    ) -> Job:
        """Submit the plain-PyTorch Monitor job (tests/slurm/jobs/monitor_job.py)."""
        self.runs.append(run)
        n = len(self.jobs)
        args = [str(JOBS / "monitor_job.py"), str(run), str(self.root / f"reports{n}")]
        args += ["--max-steps", str(max_steps), *_options(job_opts)]
        return self.sbatch(args, *options, srun=srun)

    # --- waiting ---------------------------------------------------------------------------

    def context(self) -> str:
        """What to look at when something timed out: job states, logs, run events."""
        parts = []
        for job in self.jobs:
            try:
                fields = self.cluster.job(job.job_id)
                view = " ".join(f"{k}={fields.get(k)}" for k in ("JobState", "Reason", "Restarts"))
            except AssertionError as exc:
                view = str(exc)
            parts.append(f"--- job {job.job_id}: {view}\n{job.log_tail()}")
            log = self.cluster.log_about(job)
            parts.append(f"--- slurmctld.log about job {job.job_id}:\n{log}")
        unkillable = self.cluster.base / "log" / "unkillable.log"
        if unkillable.exists():  # start.sh's UnkillableStepProgram: a step outlived SIGKILL
            parts.append(f"--- {unkillable}:\n{unkillable.read_text(errors='replace')[-8000:]}")
        for run in self.runs:
            try:
                events = read_events(run)
            except Exception as exc:
                parts.append(f"--- run {run}: unreadable ({exc})")
                continue
            lines = [
                f"{e.t:.3f} A{e.attempt} R{e.rank} {e.KIND} step={e.step}"
                + "".join(
                    f" {name}={getattr(e, name)!r}"
                    for name in ("signal", "reason", "command", "path", "error")
                    if getattr(e, name, None)
                )
                for e in events
                if e.KIND != "heartbeat"
            ]
            parts.append(f"--- run {run} events:\n" + "\n".join(lines[-40:]))
        return "\n".join(parts)

    def wait(self, condition: Callable[[], Any], what: str, timeout: float = 240.0) -> Any:
        return wait_for(condition, timeout, f"{self.name}: {what}", self.context)

    def wait_training(
        self, job: Job, attempt: int, rank: int | None = None, timeout: float = 240.0
    ) -> dict[str, Any]:
        """Until attempt ``attempt`` of ``job`` trains (its signal handlers are installed)."""
        what = f"attempt {attempt} of job {job.job_id} to train"
        report = dict(self.wait(lambda: job.report(attempt, rank), what, timeout))
        self.settled.set()
        return report

    def wait_done(self, job: Job, timeout: float = 300.0) -> dict[str, str]:
        """Until SLURM says the job ended (COMPLETED, CANCELLED, ...); returns scontrol's view."""

        def ended() -> dict[str, str] | None:
            fields = self.cluster.job(job.job_id)
            return fields if fields.get("JobState") in FINISHED else None

        return dict(self.wait(ended, f"job {job.job_id} to end", timeout))

    def wait_requeued(self, run: Path, n: int = 1, timeout: float = 240.0) -> list[Event]:
        """Until the run has ``n`` requeue_issued events; a requeue_skipped fails at once."""

        def requeued() -> list[Event] | None:
            events = read_events(run)
            skipped = [e for e in events if e.KIND == "requeue_skipped"]
            if skipped:
                raise AssertionError(
                    f"{self.name}: ckptdash skipped a requeue: {skipped[0].reason}\n"
                    + self.context()
                )
            issued = [e for e in events if e.KIND == "requeue_issued"]
            return issued if len(issued) >= n else None

        return list(self.wait(requeued, f"{n} requeue(s) of {run}", timeout))

    def status(self, run: Path) -> dict[str, Any]:
        """``ckptdash status RUN --json`` as the user runs it."""
        data: dict[str, Any] = json.loads(
            self.cluster.ckptdash("status", str(run), "--json").stdout
        )
        return data


def first(events: Iterable[Event], kind: str, attempt: int, rank: int = 0) -> Any:
    """The first event of ``kind`` written by ``attempt``/``rank``; AssertionError if none."""
    for e in events:
        if kind == e.KIND and e.attempt == attempt and e.rank == rank:
            return e
    raise AssertionError(f"no {kind} event of attempt {attempt} rank {rank}")


def requeue_timings(events: list[Event], attempt: int) -> dict[str, float]:
    """From attempt ``attempt``'s signal to its ``scontrol requeue`` returning, in seconds.

    ``to_boundary``: signal handler → the save starts (waiting for the step to end);
    ``save``: the save itself (atomic write, fsync, event); ``saved_to_requeued``: the save is
    durable → ``scontrol requeue`` returned (its event written); ``overhead``: all of it minus
    the save — what ckptdash and the scheduler add between the signal and the requeue.
    """
    sig = first(events, "signal_received", attempt)
    saved = next(
        e
        for e in events
        if e.KIND == "checkpoint_saved" and e.attempt == attempt and e.trigger == "signal"
    )
    started = next(
        e
        for e in events
        if e.KIND == "checkpoint_started" and e.attempt == attempt and e.path == saved.path
    )
    requeued = first(events, "requeue_issued", attempt)
    total = requeued.t - sig.t
    return {
        "to_boundary": started.t - sig.t,
        "save": saved.duration_s,
        "saved_to_requeued": requeued.t - saved.t,
        "overhead": total - saved.duration_s,
    }


def restart_timings(
    events: list[Event], attempt: int, process_start: float | None = None
) -> dict[str, float]:
    """From the previous attempt's requeue to attempt ``attempt`` having resumed, in seconds.

    ``requeue_to_resumed``: ``scontrol requeue`` returned → the new attempt's ``run_resumed``.
    With the new process's start time (taken before its imports): ``requeue_to_process``,
    SLURM's part (the old job ends, the requeued job waits for its credential to expire and
    is scheduled again), and ``process_to_resumed``, the new process's part (Python, torch
    and Lightning imports, Trainer set-up, the resume rule). ``started_to_resumed``:
    ``run_started`` → ``run_resumed``, ckptdash's own part (validate, choose, record).
    """
    requeued = first(events, "requeue_issued", attempt - 1)
    started = first(events, "run_started", attempt)
    resumed = first(events, "run_resumed", attempt)
    out = {"requeue_to_resumed": resumed.t - requeued.t}
    if process_start is not None:
        out["requeue_to_process"] = process_start - requeued.t
        out["process_to_resumed"] = resumed.t - process_start
    out["started_to_resumed"] = resumed.t - started.t
    return out


def _options(opts: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for key, value in opts.items():
        out += [f"--{key.replace('_', '-')}", str(value)]
    return out


Driver = Callable[[Scenario], dict[str, Any]]


class Scenarios:
    """Runs scenario drivers in threads, each once, all at the same time."""

    def __init__(self, cluster: Cluster, root: Path) -> None:
        self.cluster = cluster
        self.root = root
        self.pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="slurm-scenario")
        self.futures: dict[Driver, Future[dict[str, Any]]] = {}
        self.scenarios: dict[Driver, Scenario] = {}
        self._lock = threading.Lock()

    def start(self, drivers: Iterable[Driver]) -> None:
        """Start each driver not started yet: the :func:`starts_first` ones, then, once each of them
        trains (or ended), the others."""
        for driver in sorted(drivers, key=lambda d: not _settles_first(d)):
            if driver in self.futures:
                continue
            if not _settles_first(driver):
                for started, scenario in list(self.scenarios.items()):
                    if _settles_first(started):
                        scenario.settled.wait(SETTLE_WAIT_S)
            with self._lock:
                if driver in self.futures:
                    continue
                name = driver.__name__.removeprefix("drive_")
                folder = self.root / name
                folder.mkdir(parents=True, exist_ok=True)
                scenario = Scenario(self.cluster, folder, name)
                self.scenarios[driver] = scenario
                self.futures[driver] = self.pool.submit(self._run, driver, scenario)

    def _run(self, driver: Driver, scenario: Scenario) -> dict[str, Any]:
        began = time.monotonic()
        try:
            return driver(scenario)
        except AssertionError:
            raise
        except Exception as exc:
            raise AssertionError(
                f"{scenario.name}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}"
                f"\n{scenario.context()}"
            ) from exc
        finally:
            scenario.settled.set()  # also where it failed before its job trained
            DURATIONS[scenario.name] = time.monotonic() - began

    def result(self, driver: Driver, timeout: float = 540.0) -> dict[str, Any]:
        """The driver's observations (started now if it was not); re-raises its failure."""
        self.start([driver])
        return self.futures[driver].result(timeout=timeout)

    def shutdown(self) -> None:
        """Stop every driver still waiting (their jobs are cancelled by stop.sh)."""
        ABORT.set()
        self.pool.shutdown(wait=True, cancel_futures=True)


def starts_first(driver: Driver) -> Driver:
    """Start ``driver`` before every other scenario, and the others once its job trains.

    For a scenario whose window is the scheduler's clock (a time limit's warning signal comes
    40-70 s into the job, whatever the job is doing): all 24 jobs starting at once on two cores
    take about a minute to import Lightning, and a warning before ckptdash has set its handler
    kills the job. The others wait for it, not the other way round."""
    driver.settle_first = True  # type: ignore[attr-defined]
    return driver


def _settles_first(driver: Driver) -> bool:
    """Whether ``driver`` was marked :func:`starts_first`."""
    return bool(getattr(driver, "settle_first", False))


def scenario(driver: Driver) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Mark a test as checking ``driver``'s scenario: the session starts it with all others."""

    def mark(test: Callable[..., None]) -> Callable[..., None]:
        test.slurm_scenario = driver  # type: ignore[attr-defined]
        return test

    return mark
