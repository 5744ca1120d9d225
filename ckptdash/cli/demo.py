"""``ckptdash demo``: a small real Lightning run on CPU under a local stand-in scheduler.

The stand-in plays SLURM's part: it starts the training as attempt 0, sends
it the requeue signal (SIGUSR2) ``preempt_every_s`` seconds after it starts
training, and when the job asked to be requeued (through the requeue command
template ckptdash runs) starts the next attempt, which resumes from the signal
checkpoint. After ``max_preemptions`` of those it kills ``kills`` attempts
without warning (SIGKILL, as a node failure does) and restarts the job, which
then resumes from the newest valid periodic save. So a newcomer sees periodic
saves, preemptions, signal saves, requeues, a lost stretch of work and resumes
— with no SLURM and no GPU. The defaults last about a minute.

While it runs, the live dashboard is served on ``127.0.0.1`` (``--port``, 5006
by default; ``--no-serve`` to skip) and it stays up after the training ends
until Ctrl-C (``--exit-when-done`` ends with the training, for scripts and CI).
Ctrl-C ends everything: the training attempt, the server, the demo. It is the way the README
says to stop, so the demo then says goodbye and exits 0 (``make demo`` prints no "Error 130");
a second Ctrl-C while it stops is ignored, so that no attempt is left running.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from ckptdash.errors import CkptDashError
from ckptdash.state.reading import load_state
from ckptdash.terminal import unfiltered

if TYPE_CHECKING:
    from ckptdash.dash.server import RunningServer

REQUEUE_MARKER = ".demo-requeue"
DEFAULT_RUN_DIR = Path("runs/demo")
DEFAULT_STEPS = 1200
"""With the demo model's ~30 ms steps, about a minute with the default preemptions and kill."""
_last_line = [""]


def run_demo(
    run_dir: Path,
    *,
    steps: int = DEFAULT_STEPS,
    preempt_every_s: float = 10.0,
    max_preemptions: int = 2,
    kills: int = 1,
    port: int | None = None,
    exit_when_done: bool = True,
) -> int:
    """Run attempts until the training finishes; returns the exit status (0 after Ctrl-C,
    the documented way to stop it; 1 when an attempt failed).

    With ``port`` (0 picks a free one) the dashboard is served on 127.0.0.1 from
    before the first attempt; unless ``exit_when_done``, it keeps serving after the
    training ends until Ctrl-C.
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    if port is not None:
        _check_port_free(port)
    server: RunningServer | None = None
    main = threading.current_thread() is threading.main_thread()
    old_sigterm = signal.signal(signal.SIGTERM, _interrupt) if main else None  # `kill` = Ctrl-C
    try:
        if port is not None:
            server = _serve(run_dir, port)
        status = _train(run_dir, steps, preempt_every_s, max_preemptions, kills)
        if server is not None and not exit_when_done:
            print(
                f"ckptdash demo: still serving the dashboard at {server.url} (Ctrl-C stops)",
                flush=True,
            )
            forever = threading.Event()  # never set: wait for Ctrl-C
            while not forever.wait(3600):
                pass
        return status
    except KeyboardInterrupt as stop:
        by = "SIGTERM" if isinstance(stop, _Terminated) else "Ctrl-C"
        with _interrupts_ignored(main):  # the attempt has stopped; let the server stop too
            if server is not None:
                server.stop()
                server = None
        print(
            f"\nckptdash demo: stopped by {by}, goodbye. See the run with:"
            f" ckptdash status {run_dir}",
            flush=True,
        )
        return 0
    finally:
        if server is not None:
            server.stop()
        if main:
            signal.signal(signal.SIGTERM, old_sigterm)


def choose_run_dir(requested: Path | None) -> tuple[Path, str | None]:
    """The folder a new demo writes, and the line that says so when it is not the default.

    A demo run directory holds one demo: run again into it, the training would resume from
    its final checkpoint and end at once. So without ``--run-dir`` a second demo takes the
    first free ``runs/demo-N``; an explicit ``--run-dir`` that holds a demo is refused with
    the way out.
    """
    if requested is not None:
        if _holds_a_run(requested):
            raise CkptDashError(
                f"{requested}: holds an earlier demo (its events/); pass a new --run-dir, or"
                " remove that folder to start over"
            )
        return requested, None
    if not _holds_a_run(DEFAULT_RUN_DIR):
        return DEFAULT_RUN_DIR, None
    n = 2
    while _holds_a_run(fresh := DEFAULT_RUN_DIR.with_name(f"{DEFAULT_RUN_DIR.name}-{n}")):
        n += 1
    return fresh, (
        f"ckptdash demo: a new demo in {fresh} ({DEFAULT_RUN_DIR} holds an earlier one;"
        " --run-dir DIR chooses)"
    )


def _holds_a_run(folder: Path) -> bool:
    events = folder / "events"
    return events.is_dir() and any(events.iterdir())


class _Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``): stops the demo as Ctrl-C does."""


def _interrupt(signum: int, frame: object) -> None:
    raise _Terminated


def _check_port_free(port: int) -> None:
    """Say which option to use when the port is taken (before any training starts)."""
    if port == 0:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise CkptDashError(
                f"port {port} is in use (another dashboard?): pass --port N, --port 0 for any"
                " free port, or --no-serve"
            ) from None


def _serve(run_dir: Path, port: int) -> RunningServer:
    from ckptdash.dash.server import ServeOptions, start_server

    server = start_server(run_dir, ServeOptions(address="127.0.0.1", port=port))
    print(f"ckptdash demo: live dashboard at {server.url} (open it in a browser)", flush=True)
    return server


def _train(
    run_dir: Path, steps: int, preempt_every_s: float, max_preemptions: int, kills: int
) -> int:
    """The stand-in scheduler: attempts until one finishes without asking to be requeued."""
    marker = run_dir / REQUEUE_MARKER
    attempt, preemptions, killed = 0, 0, 0
    print(
        f"ckptdash demo: training {steps} steps in {run_dir} (Ctrl-C stops everything)",
        flush=True,
    )
    while True:
        marker.unlink(missing_ok=True)
        env = {
            **os.environ,
            "CKPTDASH_ATTEMPT": str(attempt),
            "CKPTDASH_JOB_ID": f"demo-{os.getpid()}",
        }
        cmd = [
            sys.executable,
            "-m",
            "ckptdash._dev.demo_train",
            str(run_dir),
            str(steps),
            str(marker),
        ]
        log_dir = run_dir / "logs"
        log_dir.mkdir(exist_ok=True)
        # Lightning's own chatter goes to a log file so the progress line stays readable.
        with open(log_dir / f"attempt-{attempt}.log", "wb") as log:
            # Its own session: a terminal's Ctrl-C reaches only the demo, which then stops the
            # attempt the way a scheduler does (SIGTERM: save, record the end, exit).
            proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        # The clock starts once this attempt trains (its handlers are installed by then).
        deadline: float | None = None
        kill_this = False
        try:
            while proc.poll() is None:
                training = _progress(run_dir) == attempt
                more = preemptions < max_preemptions or killed < kills
                if deadline is None and training and more:
                    deadline = time.monotonic() + preempt_every_s
                if deadline is not None and time.monotonic() >= deadline and training:
                    if preemptions < max_preemptions:
                        print(
                            f"\nckptdash demo: preempting attempt {attempt} (SIGUSR2)", flush=True
                        )
                        proc.send_signal(signal.SIGUSR2)
                        preemptions += 1
                    else:
                        print(
                            f"\nckptdash demo: killing attempt {attempt} without warning"
                            " (SIGKILL, as a node failure does)",
                            flush=True,
                        )
                        proc.kill()
                        killed += 1
                        kill_this = True
                    deadline = float("inf")
                time.sleep(0.25)
        finally:
            _end(proc)
        _progress(run_dir, final=True)
        if kill_this and proc.returncode == -signal.SIGKILL:
            attempt += 1
            print(
                f"ckptdash demo: restarting the job; attempt {attempt} resumes from the newest"
                " valid checkpoint",
                flush=True,
            )
            continue
        if proc.returncode != 0:
            print(
                f"ckptdash demo: attempt {attempt} failed (exit {proc.returncode});"
                f" see {log_dir / f'attempt-{attempt}.log'}"
            )
            return 1
        if not marker.exists():
            break
        attempt += 1
        print(f"ckptdash demo: requeued; starting attempt {attempt}", flush=True)
    marker.unlink(missing_ok=True)
    print(f"ckptdash demo: done. See it all with: ckptdash status {run_dir}", flush=True)
    return 0


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Leave no attempt behind: SIGTERM (the job saves and stops), then SIGKILL after 60 s.
    Ctrl-C pressed again meanwhile cannot cut this short."""
    if proc.poll() is not None:
        return
    with _interrupts_ignored(threading.current_thread() is threading.main_thread()):
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def _interrupts_ignored(main: bool) -> Iterator[None]:
    """Ignore Ctrl-C and SIGTERM while the block runs (signal handlers: main thread only)."""
    if not main:
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _progress(run_dir: Path, final: bool = False) -> int | None:
    """Draw the progress line; returns the attempt that is training now, if any."""
    try:
        state = load_state(run_dir)
    except Exception:
        return None
    attempt = max(state.attempts, default=None)
    info = state.attempts.get(attempt) if attempt is not None else None
    if info is None:
        return None
    total = info.max_steps or 0
    step = info.step or 0
    width = 30
    filled = int(width * step / total) if total else 0
    bar = "#" * filled + "-" * (width - filled)
    saves = len(state.checkpoints)
    line = f"\rattempt {attempt} [{bar}] step {step}/{total}  checkpoints {saves}"
    if line != _last_line[0] or final:
        _last_line[0] = line
        out = unfiltered(sys.stdout)  # the \r redraw is ours; the numbers are ckptdash's
        out.write(line + ("\n" if final else ""))
        out.flush()
    return attempt if info.step is not None and info.outcome == "running" else None
