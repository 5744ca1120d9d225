"""Real SLURM, a 2-rank gloo job launched by torchrun the way most DDP jobs start: the
preemption signal reaching torchrun's agent (``--signal=B:USR2`` with ``exec torchrun``, or
``srun torchrun``), or every process of the step. Each ends in one save, one requeue, a
resume right after the save, and no rank left running.

torch 2.13's torchrun does not catch SIGUSR2 (not in its default ``--signals-to-handle``): it
dies of it, and its ranks, in sessions of their own, notice their parent gone
(:mod:`ckptdash.train.ending.agent`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.harness import REPO_ROOT, Job, Scenario, Scenarios, read_events, scenario

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

STEPS = 400  # x ~10 ms on two gloo ranks: long enough to be signalled mid-run
WORKER = REPO_ROOT / "tests" / "train" / "dist_worker.py"
_BESIDE = Path(sys.executable).with_name("torchrun")
TORCHRUN = str(_BESIDE) if _BESIDE.exists() else "torchrun"


def _heartbeat_step(run: Path, attempt: int) -> int:
    steps = [e.step for e in read_events(run) if e.attempt == attempt and e.KIND == "heartbeat"]
    return max((s for s in steps if s is not None), default=-1)


def _torchrun(
    s: Scenario, scancel: list[str], *, srun: bool = False, agent: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Submit ``exec [srun] torchrun --nproc-per-node=2 dist_worker.py monitor ...`` with
    ``--signal=B:USR2@5``, signal it with ``scancel SCANCEL`` once attempt 0 trains, wait."""
    run, reports = s.root / "run", s.root / "reports"
    s.runs.append(run)
    args = [*agent, "--standalone", "--nproc-per-node=2", str(WORKER), "monitor"]
    args += [str(run), str(reports), "--steps", str(STEPS)]
    job: Job = s.sbatch(
        args, "--ntasks=1", "--requeue", "--signal=B:USR2@5", srun=srun, program=TORCHRUN
    )
    s.wait(lambda: _heartbeat_step(run, 0) >= 50, "attempt 0 past step 50", timeout=180)
    s.cluster.run("scancel", *scancel, "--signal=USR2", job.job_id)
    # The requeue may come after SLURM saw the batch step end (torchrun died): wait for the
    # requeued attempt to finish, then for the job.
    s.wait_requeued(run, timeout=180)

    def finished() -> bool:
        ends = [e for e in read_events(run) if e.KIND in ("run_finished", "run_failed")]
        return any(e.attempt == 1 for e in ends)

    s.wait(finished, "attempt 1 to end", timeout=240)
    fields = s.wait_done(job, timeout=120)
    left = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True).stdout
    return {
        "fields": fields,
        "events": read_events(run),
        "reports": [job.reports / f"rank{r}.json" for r in (0, 1)],
        "left": left.split(),
        "output": job.output.read_text(errors="replace"),
    }


def drive_exec_torchrun(s: Scenario) -> dict[str, Any]:
    return _torchrun(s, ["--batch"])  # what --signal=B:USR2 does: the batch shell alone


def drive_srun_torchrun(s: Scenario) -> dict[str, Any]:
    return _torchrun(s, ["--batch"], srun=True)  # srun passes it to its task: torchrun


def drive_every_process(s: Scenario) -> dict[str, Any]:
    return _torchrun(s, ["--batch", "--full"])  # the agent and both ranks at once


def drive_signals_to_handle(s: Scenario) -> dict[str, Any]:
    # The documented launch form on top: torchrun catches USR2 and passes it to the ranks.
    handle = "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"
    return _torchrun(s, ["--batch"], agent=(handle,))


def _check(r: dict[str, Any]) -> None:
    events = r["events"]
    assert r["fields"]["JobState"] == "COMPLETED" and r["fields"]["Restarts"] == "1"
    saves = [e for e in events if e.KIND == "checkpoint_saved"]
    assert [(e.attempt, e.trigger) for e in saves] == [(0, "signal")]
    assert len([e for e in events if e.KIND == "requeue_issued"]) == 1
    resumed = [e for e in events if e.KIND == "run_resumed" and e.attempt == 1]
    assert resumed and resumed[0].path == saves[0].path
    ends = {e.attempt: e for e in events if e.KIND in ("run_finished", "run_failed")}
    assert (ends[1].KIND, ends[1].reason) == ("run_finished", "completed")
    assert not r["left"], f"processes of the run still alive: {r['left']}"
    assert "torchrun (pid" in r["output"]


@scenario(drive_exec_torchrun)
def test_exec_torchrun_signalled_alone_saves_once_and_requeues_once(scenarios: Scenarios) -> None:
    """``exec torchrun`` with ``--signal=B:USR2``: torchrun dies of the signal; both ranks
    notice, save the same step, one requeue, the next attempt resumes from it and completes,
    no orphan left; the job log's start-up line says what torchrun does with each signal."""
    r = scenarios.result(drive_exec_torchrun)
    _check(r)
    assert "SIGUSR2 sent to it alone ends it" in r["output"]


@scenario(drive_srun_torchrun)
def test_srun_torchrun_signalled_through_srun_saves_once_and_requeues_once(
    scenarios: Scenarios,
) -> None:
    """``exec srun torchrun``: srun passes USR2 to torchrun, which dies of it: one save, one
    requeue, a resume from the save, no orphan left."""
    _check(scenarios.result(drive_srun_torchrun))


@scenario(drive_every_process)
def test_torchrun_and_its_ranks_signalled_together_save_once_and_requeue_once(
    scenarios: Scenarios,
) -> None:
    """USR2 to every process of the step (agent and ranks): the ranks' own signal and the
    agent's exit add up to one save and one requeue."""
    _check(scenarios.result(drive_every_process))


@scenario(drive_signals_to_handle)
def test_torchrun_told_to_handle_usr2_passes_it_on_one_save_one_requeue(
    scenarios: Scenarios,
) -> None:
    """``torchrun --signals-to-handle=...,SIGUSR2``: torchrun passes USR2 to the ranks (the
    start-up line says so), which save once and requeue once before it ends them."""
    r = scenarios.result(drive_signals_to_handle)
    _check(r)
    assert "passes SIGUSR2/SIGTERM to the ranks" in r["output"] or (
        "passes SIGTERM/SIGUSR2 to the ranks" in r["output"]
    )
