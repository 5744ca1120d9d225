"""Kubernetes pods and cloud spot VMs, by their documented conventions, with a stand-in process
tree (no cluster here): the "kubelet" sends SIGTERM, waits the grace period
(``terminationGracePeriodSeconds``), then SIGKILL; the "controller" (a Job, JobSet, Kueue)
starts the pod again. ckptdash treats the SIGTERM as a preemption to save on, counts attempts
in the run directory, and takes a restart count where the controller gives one
(``CKPTDASH_ATTEMPT``, e.g. from JobSet's restart-attempt label through the Downward API)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from ckptdash.schedulers import detect
from ckptdash.schedulers.local import LocalScheduler

POD = textwrap.dedent(
    """
    import sys, threading, ckptdash
    pause = threading.Event()
    with ckptdash.Monitor(sys.argv[1], max_steps=400, agree_interval_s=0.05) as m:
        state = m.load()
        start = 0 if state is None else state["step"] + 1
        print("START", start, m.attempt, flush=True)
        for step in range(start, 400):
            pause.wait(0.02)
            m.step(step)
            if step == start + 3:
                print("TRAINING", flush=True)
            if m.should_save:
                m.save({"step": step})
            if m.should_stop:
                break
    """
)
GRACE_S = 30.0
"""The pod's terminationGracePeriodSeconds (Kubernetes' default)."""


def _pod(run: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", POD, str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        start_new_session=True,  # the pod's own process tree
    )


def _events(run: Path, kind: str) -> list[dict[str, object]]:
    out = []
    for path in sorted((run / "events").glob("*.jsonl")):
        out += [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [e for e in out if e["kind"] == kind]


def test_sigterm_with_a_grace_period_is_a_save_and_the_restarted_pod_resumes(
    tmp_path: Path,
) -> None:
    """SIGTERM, the kill after the grace period: saved within it; the restarted pod is attempt
    1 (counted in the run directory) and resumes from the signal save. Cost: ~6 s."""
    run = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SGE_", "JOB_ID"))}
    first = _pod(run, env)
    assert first.stdout is not None
    assert first.stdout.readline().split()[:3] == ["START", "0", "0"]
    assert first.stdout.readline().strip() == "TRAINING"
    os.killpg(first.pid, signal.SIGTERM)  # the kubelet: SIGTERM to the pod's processes
    try:
        first.wait(timeout=GRACE_S)  # then it would SIGKILL
    except subprocess.TimeoutExpired:
        os.killpg(first.pid, signal.SIGKILL)
        raise AssertionError("the pod did not end within its grace period") from None
    saved = _events(run, "checkpoint_saved")
    assert [e["trigger"] for e in saved] == ["signal"]
    second = _pod(run, env)  # the controller restarts the pod
    out, _ = second.communicate(timeout=120)
    head = out.split()
    assert head[:3] == ["START", str(int(saved[0]["step"]) + 1), "1"], out  # type: ignore[call-overload]
    finished = _events(run, "run_finished")
    assert [e["reason"] for e in finished] == ["terminated", "completed"]


def test_a_controllers_restart_count_is_the_attempt_where_it_gives_one() -> None:
    """Outside SLURM and Grid Engine a pod is a local run; ``CKPTDASH_ATTEMPT`` (set from the
    controller's restart count) is the attempt, else the run directory counts."""
    pod = detect({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "CKPTDASH_ATTEMPT": "3"})
    assert isinstance(pod, LocalScheduler) and pod.attempt == 3
    assert detect({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}).attempt is None
    assert not pod.can_requeue  # the controller restarts the pod, not ckptdash
