"""Fault injection with real processes and real ``SIGKILL``, shared by the tests and
``benchmarks/faults.py`` (the long variant).

Victims are real processes forked from a ``multiprocessing`` forkserver that has
already imported torch and ckptdash, so a kill cycle costs milliseconds of start-up
instead of the seconds a fresh interpreter spends importing torch. Each victim is
a training job built from the public API (``ckptdash.Monitor``); the harness kills
it with ``SIGKILL`` at a random moment and then checks the run directory from the
outside, the way the next attempt and the dashboard see it.

Every random choice comes from one ``random.Random(seed)``; the seed is in every
report and every failure message, and ``CKPTDASH_FAULT_SEED=<seed>`` replays a run.
The random delays only choose *when* to kill; nothing waits on a sleep for a
condition (conditions are polled with a timeout).
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import ForkServerContext, ForkServerProcess
from pathlib import Path
from typing import Any, Final

import msgspec

from ckptdash import control
from ckptdash.events import (
    CheckpointFailed,
    CheckpointRemoved,
    CheckpointSaved,
    CheckpointStarted,
    CommandApplied,
    CommandExpired,
    CommandReceived,
    CommandRejected,
    Event,
)
from ckptdash.resume import check_checkpoint, choose_resume, resume_path
from ckptdash.rundir import TEMP_PREFIX, RunDir
from ckptdash.rundir.hashing import checksum_file
from ckptdash.state import RunState
from ckptdash.state.records import CheckpointInfo
from ckptdash.tail import RunTailer

PRELOAD: Final = [
    "torch",
    "ckptdash",
    "ckptdash.cli",
    "ckptdash.train.monitor",
    "tests.reliability.faults",
]
_OUTCOMES: Final = (CommandApplied, CommandRejected, CommandExpired)
_context: ForkServerContext | None = None


def context() -> ForkServerContext:
    """The forkserver context every victim is started from (torch and ckptdash preloaded)."""
    global _context
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _context = ctx
    return _context


def seed_from_env() -> int:
    """``CKPTDASH_FAULT_SEED`` if set (to replay a run), else a fresh random seed."""
    value = os.environ.get("CKPTDASH_FAULT_SEED", "")
    return int(value) if value.isdigit() else random.SystemRandom().randrange(2**32)


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Return once ``condition()`` is true; raise TimeoutError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        pause.wait(0.002)


def pause(seconds: float) -> None:
    """Let ``seconds`` pass: used only to pick a random kill moment, never to wait for a state."""
    threading.Event().wait(seconds)


def kill(proc: ForkServerProcess) -> None:
    """``SIGKILL`` the victim and reap it (so its pid is gone before the next attempt starts)."""
    if proc.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    proc.join(30)
    if proc.is_alive():  # pragma: no cover - the kernel always delivers SIGKILL
        raise RuntimeError(f"victim {proc.pid} survived SIGKILL")


# --- reading the run directory from the outside ----------------------------------------------


@dataclass
class Replay:
    """A full read of a run directory: its events, bad lines, torn tails and state."""

    state: RunState
    events: list[Event]
    bad: list[str]
    torn_tails: dict[str, int]

    @classmethod
    def of(cls, run: Path) -> Replay:
        rd = RunDir(run)
        tailer = RunTailer(rd)
        state = RunState(str(run), rd.info().run_id)
        events: list[Event] = []
        bad: list[str] = []
        for batch in tailer.batches():
            state.apply(batch)
            events.extend(batch.events)
            bad.extend(f"{b.file}:{b.line} {b.reason} {b.detail}" for b in batch.bad)
        return cls(state, events, bad, tailer.pending_bytes)

    def of_kind(self, *kinds: type[Event]) -> list[Any]:
        return [e for e in self.events if isinstance(e, kinds)]


def temp_files(folder: Path) -> set[str]:
    """Names of ckptdash temp files in ``folder``."""
    try:
        return {n for n in os.listdir(folder) if n.startswith(TEMP_PREFIX)}
    except FileNotFoundError:
        return set()


# --- kill -9 during checkpoint saves ---------------------------------------------------------


def save_victim(
    run_dir: str, size_mb: int, keep: int, ready: Any, async_save: bool = False
) -> None:
    """A job that saves ``size_mb`` MB checkpoints back to back until it is killed.

    Each step saves ``step=N.ckpt`` and, every other step, overwrites ``last.ckpt``;
    it keeps the newest ``keep`` step files (recording each removal before the
    unlink, as a rotating ModelCheckpoint does). It resumes by the resume rule
    and checks that what it loaded is the step the rule named. With ``async_save``
    it saves with ``Monitor.save_async`` and changes the payload right after each
    call (the file must still hold the step it was saved at), so most kills land
    while a persist runs in the background.
    """
    import torch

    from ckptdash.train.engine.session import Session
    from ckptdash.train.monitor import Monitor

    monitor = Monitor(run_dir, install_signals=False, heartbeat_interval_s=0.05)
    session: Session = monitor.session
    choice = monitor.resume_choice
    step = 0
    if choice.path is not None:
        loaded = monitor.load(weights_only=True)
        if loaded["step"] != choice.step:  # pragma: no cover - reported by the harness
            raise SystemExit(f"loaded step {loaded['step']} from {choice.path}, not {choice.step}")
        step = int(loaded["step"]) + 1
    folder = Path(os.path.abspath(monitor.config.checkpoint_path))
    recorded = RunState()
    recorded.apply(RunTailer(run_dir).poll())
    kept = sorted(
        (c.step or 0, c.path)
        for c in recorded.valid_checkpoints()
        if Path(c.path).name.startswith("step=")
    )
    for name in os.listdir(folder):  # unrecorded files of saves a kill interrupted
        if name.startswith("step=") and str(folder / name) not in {p for _, p in kept}:
            (folder / name).unlink()
    payload = torch.zeros(size_mb * (1 << 20) // 4, dtype=torch.float32)
    ready.set()
    while True:
        while len(kept) > keep + async_save:  # the newest may still be in flight: keep it
            _, old = kept.pop(0)
            session.writer.emit(CheckpointRemoved, path=old, reason="rotation (keep newest)")
            Path(old).unlink()
        monitor.step(step)
        payload[0] = float(step)
        state = {"payload": payload, "step": step}
        path = folder / f"step={step:06d}.ckpt"
        if async_save:
            handle = monitor.save_async(state, path, trigger="periodic")
            if step % 2 == 1:
                monitor.save_async(state, folder / "last.ckpt", trigger="periodic")
            payload[0] = -1.0  # snapshot semantics: the files keep the step
            kept.append((step, handle.path))
            step += 1
            continue
        saved = monitor.save(state, path, trigger="periodic")
        assert saved is not None
        kept.append((step, saved.path))
        if step % 2 == 1:
            monitor.save(state, folder / "last.ckpt", trigger="periodic")
        step += 1


@dataclass
class SaveKillReport:
    """What a run of :func:`kill_during_saves` did and found. ``problems`` must stay empty."""

    seed: int
    size_mb: int
    kills: int = 0
    in_save: int = 0
    in_save_writing: int = 0
    in_save_after_rename: int = 0
    temp_left: int = 0
    temp_cleaned: int = 0
    torn_tails: int = 0
    durable_checked: int = 0
    replaced_in_window: set[tuple[str, str]] = field(default_factory=set)
    resumes_loaded: int = 0
    checkpoint_bytes: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.kills} SIGKILLs of a job saving {self.checkpoint_bytes / 1e6:.0f} MB"
            f" checkpoints (seed {self.seed}, {self.seconds:.0f} s): {self.in_save} landed inside"
            f" a save ({self.in_save_writing} while the temp file was written,"
            f" {self.in_save_after_rename} between rename and record). After every kill:"
            f" {self.durable_checked} checks of durable checkpoints against their recorded size"
            f" and XXH3 checksum; {self.resumes_loaded} resume choices validated and loaded;"
            f" {self.torn_tails} torn log tails, never parsed; {self.temp_left} temp files left"
            f" by kills, {self.temp_cleaned} removed and reported by the next attempt;"
            f" {len(self.replaced_in_window)} overwrites of last.ckpt caught between rename and"
            f" record (skipped by the resume rule). {len(self.problems)} problems (damaged"
            " checkpoint, wrong or invalid resume choice, bad log line, temp file not cleaned)."
        )


def kill_during_saves(
    root: Path,
    *,
    kills: int,
    seed: int,
    size_mb: int = 50,
    keep: int = 2,
    max_delay_s: float = 0.6,
    log: Callable[[str], None] = lambda line: None,
    async_save: bool = False,
) -> SaveKillReport:
    """Start a :func:`save_victim`, kill it at a random moment, check, repeat ``kills`` times.

    After every kill: no checkpoint that was durable (``checkpoint_saved`` in the
    log) is damaged — each still matches its recorded size and checksum unless the
    log shows it was deliberately removed or replaced; the resume rule (and
    ``ckptdash.resume_path``) names the newest checkpoint that really validates,
    and it loads (``weights_only=True``) with the recorded step; the log reads
    with no bad line; temp files left by the kill are gone, and named in an
    event, once the next attempt has started.
    """
    rng = random.Random(seed)
    report = SaveKillReport(seed, size_mb)
    root.mkdir(parents=True, exist_ok=True)
    run = root / "run"
    folder = run / "checkpoints"
    ctx = context()
    durable: dict[str, str] = {}  # path -> checksum, as of the last check
    waiting: set[str] = set()  # temp files the next attempt must clean up and report
    began = time.perf_counter()
    for cycle in range(kills):
        where = f"seed {seed}, kill {cycle + 1}/{kills}"
        ready = ctx.Event()
        proc = ctx.Process(
            target=save_victim, args=(str(run), size_mb, keep, ready, async_save), daemon=True
        )
        proc.start()
        try:
            wait_for(_started(ready, proc), 120, f"the save victim to start ({where})")
            if not proc.is_alive():
                report.problems.append(f"{where}: the victim died by itself ({proc.exitcode})")
                break
            delay = rng.uniform(0, max_delay_s)
            pause(delay)
        finally:
            kill(proc)
        report.kills += 1
        replay = Replay.of(run)
        problems = _check_saves(replay, folder, durable, waiting, report)
        report.problems.extend(f"{where} (after {delay:.3f} s): {p}" for p in problems)
        log(f"kill {cycle + 1}: after {delay:.3f} s, {len(problems)} problems")
        if problems:
            break
    report.seconds = time.perf_counter() - began
    return report


def _started(ready: Any, proc: ForkServerProcess) -> Callable[[], bool]:
    return lambda: bool(ready.is_set() or not proc.is_alive())


def _check_saves(
    replay: Replay,
    folder: Path,
    durable: dict[str, str],
    waiting: set[str],
    report: SaveKillReport,
) -> list[str]:
    problems = [f"event log line skipped: {b}" for b in replay.bad]
    report.torn_tails += len(replay.torn_tails)
    state = replay.state
    latest_attempt = max(state.attempts) if state.attempts else -1
    starts = replay.of_kind(CheckpointStarted)

    def replacing(info: CheckpointInfo) -> bool:
        """A later save of the same path began: the file may be its (unrecorded) new content."""
        return any(s.path == info.path and s.t > (info.t or 0) for s in starts)

    # 1. Every checkpoint durable before this kill, and every one recorded since, validates.
    really_valid: list[CheckpointInfo] = []
    candidates = {c.path for c in state.valid_checkpoints()} | set(durable)
    for path in sorted(candidates):
        info = state.checkpoints.get(path)
        if info is None:
            problems.append(f"{path}: was durable, and the log no longer mentions it")
            continue
        if info.status == "removed":
            continue  # rotation: recorded before the unlink
        if info.status not in ("saved", "invalid"):
            problems.append(f"{path}: durable checkpoint now has status {info.status!r}")
            continue
        why = check_checkpoint(info)
        if why is None:
            report.durable_checked += 1
            if info.status == "saved":
                really_valid.append(info)
        elif replacing(info):
            report.replaced_in_window.add((path, info.checksum))  # renamed in, not recorded
        else:
            problems.append(f"{path}: durable checkpoint damaged: {why}")
    durable.clear()
    durable.update({c.path: c.checksum for c in really_valid})

    # 2. The resume rule names the newest checkpoint that really validates, and it loads.
    choice = choose_resume(replay.state.root)
    really_valid.sort(key=lambda c: (c.step or 0, c.t or 0.0, c.path))
    expected = really_valid[-1].path if really_valid else None
    if choice.path != expected:
        problems.append(f"resume rule chose {choice.path}, expected {expected} ({choice.reason})")
    if resume_path(replay.state.root) != choice.path:
        problems.append("ckptdash.resume_path disagrees with choose_resume")
    if choice.path is not None:
        problems.extend(_verify_load(state.checkpoints[choice.path]))
        report.resumes_loaded += 1

    # 3. Where did the kill land? (for the report)
    killed = [
        e
        for e in replay.events
        if e.attempt == latest_attempt
        and isinstance(e, (CheckpointStarted, CheckpointSaved, CheckpointFailed))
    ]
    temps_now = temp_files(folder)
    sizes = [c.size_bytes or 0 for c in state.checkpoints.values()]
    report.checkpoint_bytes = max([report.checkpoint_bytes, *sizes])
    if killed and isinstance(killed[-1], CheckpointStarted):
        report.in_save += 1
        target = Path(killed[-1].path)
        if any(n.startswith(f"{TEMP_PREFIX}{target.name}.") for n in temps_now):
            report.in_save_writing += 1
        elif target.exists():
            info = state.checkpoints.get(str(target))
            if info is None or info.status != "saved" or check_checkpoint(info) is not None:
                report.in_save_after_rename += 1

    # 4. Temp files: the last attempt cleaned and reported the ones the kill before left.
    texts = " ".join(
        e.error if isinstance(e, CheckpointFailed) else e.path
        for e in replay.of_kind(CheckpointFailed, CheckpointRemoved)
    )
    for name in sorted(waiting):
        if (folder / name).exists():
            problems.append(f"{name}: a temp file of an earlier kill was not cleaned up")
        elif name not in texts:
            problems.append(f"{name}: a temp file was removed without being reported")
        else:
            report.temp_cleaned += 1
    report.temp_left += len(temps_now - waiting)
    waiting.clear()
    waiting.update(temps_now)
    return problems


def _verify_load(info: CheckpointInfo) -> list[str]:
    import torch

    size, checksum = checksum_file(info.path)
    if (size, checksum) != (info.size_bytes, info.checksum):
        return [f"{info.path}: the resume choice does not match its record"]
    try:
        obj = torch.load(info.path, map_location="cpu", weights_only=True)
    except Exception as exc:
        return [f"{info.path}: the resume choice does not load: {exc!r}"]
    if obj.get("step") != info.step or float(obj["payload"][0]) != float(info.step or 0):
        return [f"{info.path}: holds step {obj.get('step')}, recorded {info.step}"]
    return []


# --- kill -9 during event writes and command claims ------------------------------------------


def job_victim(run_dir: str, ready: Any, heartbeat_s: float, poll_s: float) -> None:
    """A fast training job: claims commands, answers them, saves small checkpoints, writes
    heartbeats (every 20th with 3,000 metrics, a ~60 KB line a kill can tear), until it is
    killed or a ``stop_after_save`` ends it cleanly."""
    from ckptdash.train.monitor import Monitor

    big = {f"metric_{i}": float(i) for i in range(3000)}
    with Monitor(
        run_dir,
        install_signals=False,
        heartbeat_interval_s=heartbeat_s,
        poll_interval_s=poll_s,
        agree_interval_s=min(poll_s, 0.01),
    ) as monitor:
        choice = monitor.resume_choice
        step = 0 if choice.step is None else choice.step + 1
        ready.set()
        while True:
            metrics: dict[str, Any] = big if step % 20 == 0 else {"loss": 1.0 / (step + 1)}
            monitor.step(step, **metrics)
            if monitor.should_save:
                monitor.save({"step": step})
            if monitor.should_stop:
                break
            step += 1


@dataclass
class CrashReport:
    """What a run of :func:`crash_during_commands` did and found."""

    seed: int
    crashes: int = 0
    commands: int = 0
    malformed: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    modes: Counter[str] = field(default_factory=Counter)
    orphans_left: set[str] = field(default_factory=set)
    received_unanswered: set[str] = field(default_factory=set)
    answered_not_filed: set[str] = field(default_factory=set)
    saves_interrupted: int = 0
    torn_tails: int = 0
    events_read: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        o = self.outcomes
        return (
            f"{self.crashes} SIGKILLs of a job claiming commands and writing events (seed"
            f" {self.seed}, {self.seconds:.0f} s; aimed at: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.modes.items()))
            + f"); {self.commands} commands ({self.malformed}"
            f" malformed): {o['command_applied']} applied, {o['command_rejected']} rejected,"
            f" {o['command_expired']} expired, 0 lost, 0 applied twice; kills left"
            f" {len(self.orphans_left)} claimed-unanswered files,"
            f" {len(self.received_unanswered)} received without outcome,"
            f" {len(self.answered_not_filed)} answered-not-filed,"
            f" {self.saves_interrupted} saves mid-way, {self.torn_tails} torn log tails;"
            f" {self.events_read} events read, 0 bad lines; {len(self.problems)} problems"
        )


_MALFORMED: Final[tuple[str, ...]] = (
    "garbage",
    "not_an_object",
    "unknown_command",
    "wrong_id",
    "no_author",
    "extra_field",
    "oversized",
)
# A folder or a link named like a command is never claimed (issue 22): it is not a command the
# job answers, so it has no place among these (tests/test_control.py pins that it stays put).


def write_bad_command(inbox: Path, kind: str, cid: str, rng: random.Random) -> None:
    """Put a malformed command of ``kind`` into ``inbox`` as ``<cid>.json``."""
    path = inbox / f"{cid}.json"
    good = {"command": "save_now", "v": 1, "id": cid, "t": time.time(), "author": "fuzz"}
    good["host"] = "h"
    data: bytes
    if kind == "garbage":
        data = rng.randbytes(rng.randrange(0, 200))
    elif kind == "not_an_object":
        data = b"[1, 2, 3]\n"
    elif kind == "unknown_command":
        data = msgspec.json.encode({**good, "command": "format_disk"})
    elif kind == "wrong_id":
        data = msgspec.json.encode({**good, "id": "someone-else"})
    elif kind == "no_author":
        data = msgspec.json.encode({k: v for k, v in good.items() if k != "author"})
    elif kind == "extra_field":
        data = msgspec.json.encode({**good, "sudo": True})
    elif kind == "oversized":
        data = msgspec.json.encode({**good, "pad": "x" * 70_000})
    else:  # pragma: no cover
        raise ValueError(kind)
    tmp = inbox / f"{TEMP_PREFIX}{cid}"
    tmp.write_bytes(data)
    tmp.rename(path)


def _claimed(run: Path, waiting: int, proc: ForkServerProcess) -> Callable[[], bool]:
    inbox = RunDir(run).inbox
    return lambda: len(_listing(inbox)) < waiting or not proc.is_alive()


def issue_batch(run: Path, rng: random.Random, expected: dict[str, str]) -> int:
    """Issue 0-6 commands: valid, already expired, or malformed; ``expected`` gets id -> kind.
    Returns how many commands the inbox holds now."""
    inbox = RunDir(run).inbox
    for _ in range(rng.randrange(0, 7)):
        roll = rng.random()
        if roll < 0.5:
            cmd = control.issue(run, "save_now", author="tester", host="testhost")
            expected[cmd.id] = "valid"
        elif roll < 0.65:
            cmd = control.issue(run, "save_now", ttl_s=1, now=time.time() - 60)
            expected[cmd.id] = "expired"
        else:
            cid = f"{time.time_ns():020d}-bad{rng.randrange(10**6):06d}"
            write_bad_command(inbox, rng.choice(_MALFORMED), cid, rng)
            expected[cid] = "malformed"
    return len(_listing(inbox))


def crash_during_commands(
    root: Path,
    *,
    crashes: int,
    seed: int,
    max_delay_s: float = 0.15,
    log: Callable[[str], None] = lambda line: None,
) -> CrashReport:
    """Kill a :func:`job_victim` ``crashes`` times at random moments while commands arrive.

    Each kill is aimed at random: start-up (20 %: opening the log, answering what earlier
    kills left), the running job (40 %), or the first milliseconds after a claim (40 %).

    After every kill: no line of the log is bad (a torn last line is never
    parsed), and no command has more than one ``command_received``, more than
    one outcome, or more than one ``command_applied``. At the end one clean run
    answers what is left, and then every command ever issued has exactly one
    outcome, the one its kind calls for, and its file sits in ``control/done/``.
    """
    rng = random.Random(seed)
    report = CrashReport(seed)
    root.mkdir(parents=True, exist_ok=True)
    run = root / "run"
    RunDir(run).ensure()
    expected: dict[str, str] = {}
    ctx = context()
    began = time.perf_counter()
    for cycle in range(crashes):
        where = f"seed {seed}, crash {cycle + 1}/{crashes}"
        waiting = issue_batch(run, rng, expected)
        ready = ctx.Event()
        proc = ctx.Process(target=job_victim, args=(str(run), ready, 0.002, 1e-4), daemon=True)
        # Where to aim: start-up (opening the log, answering what earlier kills left),
        # a running job, or the few milliseconds after it claimed commands.
        roll = rng.random()
        mode = "start-up" if roll < 0.2 else "running" if roll < 0.6 or not waiting else "claim"
        delay = rng.uniform(0, {"start-up": 0.05, "running": max_delay_s, "claim": 0.01}[mode])
        proc.start()
        with contextlib.suppress(TimeoutError):
            if mode == "running":
                wait_for(_started(ready, proc), 60, "the job to start")
            elif mode == "claim":
                wait_for(_claimed(run, waiting, proc), 60, "a claim")
        pause(delay)
        report.modes[mode] += 1
        if not proc.is_alive():
            report.problems.append(f"{where}: the victim ended by itself ({proc.exitcode})")
        kill(proc)
        report.crashes += 1
        replay = Replay.of(run)
        problems = _check_commands(replay, run, report, final=False)
        report.problems.extend(f"{where} (after {delay:.3f} s): {p}" for p in problems)
        log(f"crash {cycle + 1}: after {delay:.3f} s, {len(problems)} problems")
        if problems:
            break
    if not report.problems:
        _final_run(run, ctx, expected, report)
    report.commands = len(expected)
    report.malformed = sum(1 for k in expected.values() if k == "malformed")
    report.seconds = time.perf_counter() - began
    return report


def _answers(replay: Replay) -> tuple[Counter[str], Counter[str], dict[str, list[Any]]]:
    received = Counter(e.command_id for e in replay.of_kind(CommandReceived))
    applied = Counter(e.command_id for e in replay.of_kind(CommandApplied))
    outcomes: dict[str, list[Any]] = {}
    for e in replay.of_kind(*_OUTCOMES):
        outcomes.setdefault(e.command_id, []).append(e)
    return received, applied, outcomes


def _check_commands(replay: Replay, run: Path, report: CrashReport, *, final: bool) -> list[str]:
    problems = [f"event log line skipped: {b}" for b in replay.bad]
    received, applied, outcomes = _answers(replay)
    problems += [f"{cid}: received {n} times" for cid, n in received.items() if n > 1]
    problems += [f"{cid}: applied {n} times" for cid, n in applied.items() if n > 1]
    problems += [
        f"{cid}: {len(evs)} outcomes ({', '.join(e.KIND for e in evs)})"
        for cid, evs in outcomes.items()
        if len(evs) > 1
    ]
    if not final:
        rd = RunDir(run)
        claimed = {n.removesuffix(".json") for n in _listing(rd.claimed)}
        report.orphans_left.update(cid for cid in claimed if cid not in outcomes)
        report.answered_not_filed.update(cid for cid in claimed if cid in outcomes)
        report.received_unanswered.update(cid for cid in received if cid not in outcomes)
        last = max(replay.state.attempts) if replay.state.attempts else -1
        ckpt = [
            e
            for e in replay.events
            if e.attempt == last and isinstance(e, (CheckpointStarted, CheckpointSaved))
        ]
        report.saves_interrupted += bool(ckpt and isinstance(ckpt[-1], CheckpointStarted))
        report.torn_tails += len(replay.torn_tails)
    return problems


def _final_run(
    run: Path, ctx: ForkServerContext, expected: dict[str, str], report: CrashReport
) -> None:
    """One clean attempt answers everything left, then a stop command ends it."""
    ready = ctx.Event()
    proc = ctx.Process(target=job_victim, args=(str(run), ready, 0.05, 0.005), daemon=True)
    proc.start()
    rd = RunDir(run)
    try:
        wait_for(ready.is_set, 120, "the final clean attempt to start")

        def settled() -> bool:
            return not _listing(rd.inbox) and not _listing(rd.claimed)

        wait_for(settled, 60, "the final attempt to answer every pending command")
        stop = control.issue(run, "stop_after_save", author="tester", host="testhost")
        proc.join(60)
        if proc.exitcode != 0:
            report.problems.append(f"the final attempt ended with exit code {proc.exitcode}")
    finally:
        kill(proc)
    replay = Replay.of(run)
    report.events_read = len(replay.events)
    report.problems.extend(_check_commands(replay, run, report, final=True))
    _, _, outcomes = _answers(replay)
    saved = {e.path for e in replay.of_kind(CheckpointSaved)}
    for cid, kind in {**expected, stop.id: "valid"}.items():
        evs = outcomes.get(cid, [])
        if len(evs) != 1:
            report.problems.append(f"{cid} ({kind}): {len(evs)} outcomes, expected exactly 1")
            continue
        out = evs[0]
        report.outcomes[out.KIND] += 1
        if kind == "malformed" and not (isinstance(out, CommandRejected) and out.reason):
            report.problems.append(f"{cid}: malformed, answered {out.KIND} instead of rejected")
        if kind == "expired" and not isinstance(out, CommandExpired):
            report.problems.append(f"{cid}: expired before it was seen, answered {out.KIND}")
        if kind == "valid" and isinstance(out, CommandRejected):
            report.problems.append(f"{cid}: a valid command was rejected: {out.reason}")
        if isinstance(out, CommandApplied) and out.detail not in saved:
            report.problems.append(f"{cid}: applied with {out.detail!r}, not a recorded save")
        if not os.path.lexists(rd.done / f"{cid}.json"):
            report.problems.append(f"{cid}: its file is not in control/done/")
    leftovers = _listing(rd.inbox) + _listing(rd.claimed)
    if leftovers:
        report.problems.append(f"command files left behind: {leftovers}")


def _listing(folder: Path) -> list[str]:
    return sorted(n for n in os.listdir(folder) if not n.startswith("."))


# --- many dashboards against one job ---------------------------------------------------------


def issuer(run_dir: str, index: int, count: int, start: Any, out: str) -> None:
    """One dashboard or CLI: waits at the barrier for the others, then issues ``count``
    Save-now commands as fast as it can (even indices through ``ckptdash save``, odd
    through ``control.issue``) and writes the ids it got to ``out``."""
    from ckptdash import cli

    start.wait()
    ids = []
    for _ in range(count):
        if index % 2 == 0:
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                if cli.main(["save", run_dir]) != 0:
                    raise SystemExit(f"ckptdash save failed: {buf.getvalue()}")
            ids.append(_full_id(run_dir, buf.getvalue().split()[1]))  # "save_now <id> queued"
        else:
            ids.append(control.issue(run_dir, "save_now", author=f"dash{index}").id)
    Path(out).write_text("\n".join(ids) + "\n")


def _full_id(run_dir: str, shown: str) -> str:
    """The full id of the command ``ckptdash save`` just issued and printed as ``shown`` (its
    8 random hex digits): the file that holds it, wherever the job has moved it by now."""
    for _ in range(3):  # a file moving between two folders while they are listed
        for where in ("inbox", "claimed", "done"):
            folder = Path(run_dir) / "control" / where
            for name in os.listdir(folder) if folder.is_dir() else []:
                if name.endswith(f"-{shown}.json"):
                    return name.removesuffix(".json")
    raise SystemExit(f"no command file for the id {shown} that ckptdash save printed")


@dataclass
class RaceReport:
    """What :func:`race_commands` did and found."""

    issuers: int
    commands: int = 0
    applied: int = 0
    saves: int = 0
    most_per_save: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.issuers} concurrent dashboards/CLIs raced {self.commands} commands against"
            f" one running job in {self.seconds:.1f} s: {self.applied} applied exactly once,"
            f" 0 twice, 0 lost, {self.saves} saves (up to {self.most_per_save} commands"
            f" answered by one save); {len(self.problems)} problems"
        )


def race_commands(root: Path, *, issuers: int = 8, per_issuer: int = 13) -> RaceReport:
    """``issuers`` processes issue ``per_issuer`` commands each, all at once, against one job.

    Then: every command has exactly one ``command_received`` and exactly one
    outcome, ``command_applied`` naming a recorded checkpoint; every file ends in
    ``control/done/``; the job's ``status`` view agrees.
    """
    report = RaceReport(issuers)
    root.mkdir(parents=True, exist_ok=True)
    run = root / "run"
    ctx = context()
    ready = ctx.Event()
    job = ctx.Process(target=job_victim, args=(str(run), ready, 0.05, 0.001), daemon=True)
    job.start()
    began = time.perf_counter()
    outs = [root / f"issuer-{i}.txt" for i in range(issuers)]
    try:
        wait_for(ready.is_set, 120, "the job to start")
        gate = ctx.Barrier(issuers)
        procs = [
            ctx.Process(target=issuer, args=(str(run), i, per_issuer, gate, str(outs[i])))
            for i in range(issuers)
        ]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            if p.exitcode != 0:
                report.problems.append(f"issuer {p.name} ended with {p.exitcode}")
        ids = [line for out in outs if out.exists() for line in out.read_text().split()]
        report.commands = len(ids)
        tailer = RunTailer(run)
        answered: set[str] = set()
        bad: list[str] = []

        def all_answered() -> bool:
            batch = tailer.poll()
            bad.extend(str(b) for b in batch.bad)
            answered.update(e.command_id for e in batch.events if isinstance(e, _OUTCOMES))
            return answered >= set(ids)

        wait_for(all_answered, 60, "an outcome for every command")
        report.problems.extend(f"live reader saw a bad line: {b}" for b in bad)
        control.issue(run, "stop_after_save", author="tester")
        job.join(60)
        if job.exitcode != 0:
            report.problems.append(f"the job ended with exit code {job.exitcode}")
    finally:
        kill(job)
    report.seconds = time.perf_counter() - began
    replay = Replay.of(run)
    received, applied, outcomes = _answers(replay)
    saved = {e.path for e in replay.of_kind(CheckpointSaved)}
    per_save = Counter(e.detail for e in replay.of_kind(CommandApplied))
    report.saves = len(per_save)
    report.most_per_save = max(per_save.values(), default=0)
    if len(set(ids)) != len(ids):
        report.problems.append("two issuers got the same command id")
    rd = RunDir(run)
    for cid in ids:
        evs = outcomes.get(cid, [])
        if received[cid] != 1 or len(evs) != 1 or not isinstance(evs[0], CommandApplied):
            kinds = [e.KIND for e in evs]
            report.problems.append(f"{cid}: received {received[cid]}×, outcomes {kinds}")
            continue
        if evs[0].detail not in saved:
            report.problems.append(f"{cid}: applied with {evs[0].detail!r}, not a recorded save")
        if not (rd.done / f"{cid}.json").exists():
            report.problems.append(f"{cid}: its file is not in control/done/")
        if replay.state.commands[cid].status != "applied":
            report.problems.append(f"{cid}: status shows {replay.state.commands[cid].status}")
        report.applied += applied[cid] == 1
    report.problems.extend(f"event log line skipped: {b}" for b in replay.bad)
    return report


# --- two jobs on one run directory -----------------------------------------------------------


def contender(run_dir: str, barrier: Any, finish: Any, out: str) -> None:
    """A job that starts at the barrier; it writes ``won`` (then saves and ends when
    ``finish`` is set) or ``refused`` and the error message to ``out``."""
    from ckptdash.errors import RunDirError
    from ckptdash.train.monitor import Monitor

    barrier.wait()
    try:
        monitor = Monitor(run_dir, install_signals=False)
    except RunDirError as exc:
        Path(out).write_text(f"refused\n{exc}\n")
        return
    Path(out).write_text(f"won\n{os.getpid()}\n")
    finish.wait(60)
    monitor.step(1)
    monitor.save({"step": 1, "pid": os.getpid()})
    monitor.close()


# --- permissions -----------------------------------------------------------------------------


def unprivileged_saves(run_dir: str, out: str) -> None:
    """As ``nobody``: save step 1, make the checkpoint folder read-only for its owner, try
    step 2, then try to start a job whose events folder is read-only. Writes what happened
    (as JSON) to ``out``."""
    import json

    from ckptdash.errors import CkptDashError
    from ckptdash.train.monitor import Monitor

    os.setgid(65534)
    os.setuid(65534)
    result: dict[str, str] = {}
    with Monitor(run_dir, install_signals=False) as monitor:
        monitor.step(1)
        monitor.save({"step": 1})
        os.chmod(monitor.config.checkpoint_path, 0o555)
        monitor.step(2)
        try:
            monitor.save({"step": 2})
        except CkptDashError as exc:
            result["save"] = f"{type(exc).__name__}: {exc}"
        os.chmod(monitor.config.checkpoint_path, 0o755)
    os.chmod(Path(run_dir) / "events", 0o555)
    try:
        Monitor(run_dir, install_signals=False)
    except CkptDashError as exc:
        result["start"] = f"{type(exc).__name__}: {exc}"
    Path(out).write_text(json.dumps(result))
