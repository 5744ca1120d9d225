"""A preemption signal that reaches torchrun's agent alone (``--signal=B:USR2`` with
``exec torchrun``): the agent dies of it, and its ranks, noticing their parent gone, save,
try to requeue and stop instead of training on unsaved as orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from ckptdash.train.ending import agent
from tests.conftest import WaitUntil
from tests.slurm.harness import read_events
from tests.train.helpers import state_of

WORKER = textwrap.dedent(
    """
    import json, os, sys, threading, torch, ckptdash
    run, ready = sys.argv[1], sys.argv[2]
    model = torch.nn.Linear(4, 1)
    with ckptdash.Monitor(run, max_steps=100_000, agree_interval_s=0.01, pulse_interval_s=0) as m:
        for step in range(100_000):
            threading.Event().wait(0.002)
            if step == 5:
                with open(ready, "w") as f:
                    json.dump({"pid": os.getpid(), "agent": os.getppid()}, f)
            m.step(step)
            if m.should_save:
                m.save({"model": model.state_dict(), "step": step})
            if m.should_stop:
                break
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def test_a_rank_whose_torchrun_agent_dies_of_the_signal_saves_and_stops(
    tmp_path: Path, wait_until: WaitUntil
) -> None:
    """SIGUSR2 to torchrun alone ends it (torch 2.13 does not catch it by default); the rank
    says so at start, records ``launcher-exited`` with the requeue action, saves the step it
    was at and exits, instead of training on as an orphan."""
    run, script, ready = tmp_path / "run", tmp_path / "worker.py", tmp_path / "ready.json"
    script.write_text(WORKER)
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"]
    launcher = subprocess.Popen(
        [*argv, str(script), str(run), str(ready)], stderr=subprocess.PIPE, text=True
    )
    try:
        wait_until(ready.exists, timeout=120, what="the rank to train")
        wait_until(lambda: ready.read_text().endswith("}"), what="the rank's pid")
        pids = json.loads(ready.read_text())
        assert pids["agent"] == launcher.pid
        launcher.send_signal(signal.SIGUSR2)
        assert launcher.wait(timeout=60) == -signal.SIGUSR2  # the agent dies of it
        wait_until(lambda: not _alive(pids["pid"]), timeout=60, what="the orphaned rank to stop")
    finally:
        if launcher.poll() is None:
            launcher.kill()
        assert launcher.stderr is not None
        stderr = launcher.stderr.read()
    assert "torchrun (pid" in stderr and "SIGUSR2 sent to it alone ends it" in stderr
    state = state_of(run)
    (sig,) = [c for c in state.checkpoints.values() if c.trigger == "signal"]
    assert sig.status == "saved"
    exits = [e for e in read_events(run) if getattr(e, "signal", "") == agent.AGENT_EXITED]
    assert len(exits) == 1 and exits[0].action == "requeue"
    assert state.attempts[0].outcome != "finished"


def test_no_agent_is_watched_outside_a_launcher() -> None:
    """A process started by a shell or srun (no TORCHELASTIC_RUN_ID, no deepspeed launcher)
    watches no agent; the exit action is the strongest configured one."""
    assert agent.detect({}) is None
    assert agent.detect({"TORCHELASTIC_RUN_ID": "x"}) == agent.LauncherAgent(
        "torchrun", os.getppid()
    )
    assert agent.action_on_exit({"SIGUSR2": "requeue", "SIGTERM": "terminate"}) == "requeue"
    assert agent.action_on_exit({"SIGTERM": "terminate"}) == "terminate"
    # A fresh interpreter, not pytest's own process: an earlier in-process run may have left
    # ckptdash's late-signal holder installed, as it does after every run that finished.
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        caught = agent.caught_signals(child.pid)  # Python itself catches SIGINT
    finally:
        child.kill()
        child.wait()
    assert caught is not None and signal.SIGINT in caught and signal.SIGUSR2 not in caught
