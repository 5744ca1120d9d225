"""Grid Engine without a cell: a fake runner answers as qstat/qmod/qalter/qhold/qrls/qdel of
Son of Grid Engine 8.1.9 did on a real one (their output copied from tests/gridengine runs);
tests/gridengine drives the real scheduler."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence

import pytest

from ckptdash import schedulers
from ckptdash.errors import SchedulerError, SchedulerUnavailable
from ckptdash.schedulers import gridengine
from ckptdash.schedulers.base import RequeueResult
from ckptdash.schedulers.gridengine import GridEngineScheduler
from ckptdash.schedulers.gridengine_queue import GridEngineQueue

ENV = {"JOB_ID": "12", "SGE_ROOT": "/var/lib/gridengine", "SGE_CELL": "default"}
HEAD = (
    "job-ID  prior   name       user         state submit/start at     queue"
    "                          slots ja-task-ID \n" + "-" * 113 + "\n"
)


def listing(*rows: tuple[str, str, str]) -> str:
    """``qstat -u '*'`` with one row per (job, state, task column)."""
    return HEAD + "".join(
        f"     {j} 0.50000 job.sh     root         {st:5} 12/03/2026 13:50:14 all.q@vm"
        f"                           1 {task}\n"
        for j, st, task in rows
    )


def xml(job: str = "12", restart: str = "1", uid: int | None = None, h_rt: str = "") -> str:
    limit = (
        "<JB_hard_resource_list><qstat_l_requests><CE_name>h_rt</CE_name><CE_valtype>3"
        f"</CE_valtype><CE_stringval>{h_rt}</CE_stringval><CE_doubleval>{h_rt}.000000"
        "</CE_doubleval></qstat_l_requests></JB_hard_resource_list>"
        if h_rt
        else ""
    )
    return (
        f"<?xml version='1.0'?><detailed_job_info><djob_info><element><JB_job_number>{job}"
        f"</JB_job_number><JB_owner>me</JB_owner><JB_uid>{os.geteuid() if uid is None else uid}"
        f"</JB_uid>{limit}<JB_restart>{restart}</JB_restart><JB_ja_tasks><ulong_sublist>"
        "<JAT_status>128</JAT_status><JAT_start_time>1000</JAT_start_time>"
        "</ulong_sublist></JB_ja_tasks></element></djob_info></detailed_job_info>"
    )


class FakeCell:
    """Answers Grid Engine's commands from a dict of job -> state; records what ran."""

    def __init__(self, states: dict[str, str], restart: str = "1", uid: int | None = None):
        self.states = states
        self.restart = restart
        self.uid = uid
        self.ran: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        argv = list(argv)
        self.ran.append(argv)
        cmd, job = argv[0], argv[-1]
        if cmd == "qstat" and argv[1] == "-xml":
            if job not in self.states:
                return 0, f"<unknown_jobs><ST_name>{job}</ST_name></unknown_jobs>"
            return 0, xml(job, self.restart, self.uid)
        if cmd == "qstat":
            return 0, listing(*((j, s, "") for j, s in self.states.items()))
        if cmd == "qhold":
            self.states[job] = "h" + self.states[job]
            return 0, f"modified hold of job {job}"
        if cmd == "qrls":
            self.states[job] = self.states[job].replace("h", "")
            return 0, f"modified hold of job {job}"
        if cmd == "qdel":
            del self.states[job]
            return 0, f"me has deleted job {job}"
        if cmd == "qalter":
            self.restart = "1" if argv[2] == "y" else "2"
            return 0, f"modified restart behaviour of job {job}"
        if cmd == "qmod" and argv[1] == "-rj":
            if self.restart == "2":  # exit 0 when it refuses, as the real one
                return 0, f"job {job} is not restartable"
            self.states[job] = ("h" if "h" in self.states[job] else "") + "Rq"
            return 0, f"Pushed rescheduling of job {job} on host vm"
        raise AssertionError(argv)

    def made(self, *argv: str) -> bool:
        return list(argv) in self.ran


def test_detected_from_job_id_with_the_cell_and_array_tasks_are_job_dot_task() -> None:
    """JOB_ID with SGE_ROOT/SGE_CELL is Grid Engine; SGE_TASK_ID=undefined is no array; a
    task's id is JOB.TASK (what qmod -rj takes); SLURM's variables still win."""
    assert isinstance(schedulers.detect(ENV), GridEngineScheduler)
    assert schedulers.detect({"JOB_ID": "12"}).name == "local"
    assert GridEngineScheduler({**ENV, "SGE_TASK_ID": "undefined"}).job_id == "12"
    assert GridEngineScheduler({**ENV, "SGE_TASK_ID": "3"}).job_id == "12.3"
    assert GridEngineScheduler(ENV).attempt is None  # RESTARTED is a flag: count in the run dir
    assert schedulers.detect({**ENV, "SLURM_JOB_ID": "7"}).name == "slurm"


def test_usr1_is_handled_so_a_suspend_warning_does_not_kill_python() -> None:
    """Grid Engine's SIGUSR1 (suspend with -notify, s_rt) is one of its signals: the session
    records it instead of leaving Python's default action, which ends the process."""
    assert GridEngineScheduler(ENV).signals == {"SIGUSR1": "ignore"}
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # what a plain job would have


def test_a_qdel_is_told_apart_from_a_reschedule_by_the_job_state() -> None:
    """The same SIGUSR2 precedes a qdel and a reschedule; qstat's ``dr`` says it is a qdel."""
    cell = FakeCell({"12": "dr", "13": "r"})
    assert "being deleted (qstat state dr)" in GridEngineScheduler(ENV, cell).cancelled()
    assert GridEngineScheduler({**ENV, "JOB_ID": "13"}, cell).cancelled() == ""
    tasks = lambda argv, t: (0, listing(("12", "r", "1"), ("12", "dr", "2")))  # noqa: E731
    assert GridEngineScheduler({**ENV, "SGE_TASK_ID": "2"}, tasks).cancelled()
    assert not GridEngineScheduler({**ENV, "SGE_TASK_ID": "1"}, tasks).cancelled()
    assert gridengine.state_of(listing(("12", "qw", "1-4:1")), "12", "3") == "qw"
    assert gridengine.state_of(listing(("12", "qw", "1-4:2")), "12", "2") is None


def test_qmod_rj_is_judged_by_its_output_not_its_exit_status() -> None:
    """qmod -rj exits 0 when it refuses; only "Pushed rescheduling" is a requeue."""
    assert gridengine.requeue_ok(0, "Pushed rescheduling of job 12 on host vm")
    assert gridengine.requeue_ok(0, "Pushed rescheduling of job-array task 3.1 on host vm")
    assert not gridengine.requeue_ok(0, "The job 12 is already in deleted state. No rescheduling!")
    assert not gridengine.requeue_ok(0, "job 12 is not restartable")
    assert not gridengine.requeue_ok(0, "")
    assert not gridengine.requeue_ok(1, 'invalid queue or job "12"')


def test_a_job_that_says_restart_n_or_is_being_deleted_is_not_requeued() -> None:
    """Exit 99 would rerun even a ``-r n`` job, so ckptdash refuses itself where qstat says
    ``restart: n`` (qsub -r n, qalter -r n), naming how to allow it, and for a job being
    deleted; an array task is named JOB.TASK."""
    task = {**ENV, "SGE_TASK_ID": "3"}
    refused = GridEngineScheduler(task, FakeCell({"12": "r"}, restart="2"))
    result = refused.requeue()
    assert (result.ok, result.command) == (False, "exit 99")
    assert "job 12.3 is not restartable" in result.output, result
    assert "`qalter -r y 12.3`" in result.output
    assert refused.exit_status is None
    deleted = GridEngineScheduler(ENV, FakeCell({"12": "dr"})).requeue()
    assert not deleted.ok and "being deleted (qstat state dr)" in deleted.output
    for restart in ("1", "0"):  # -r y, or left to the queue: exit 99 reruns it
        assert GridEngineScheduler(ENV, FakeCell({"12": "r"}, restart=restart)).requeue().ok


def test_time_left_from_h_rt_and_the_start_time() -> None:
    """No variable gives the limit: qstat -xml -j has h_rt and JAT_start_time."""
    assert gridengine.parse_time_left(xml(h_rt="600"), now=1100.0) == 500.0
    assert gridengine.parse_time_left(xml(h_rt="60"), now=2000.0) == 0.0
    assert gridengine.parse_time_left(xml(), now=1100.0) is None
    asked = GridEngineScheduler(ENV, lambda argv, t: (0, xml(h_rt="600")))
    left = asked.time_left_s()
    assert left is not None and left <= 600.0


def test_hold_release_and_cancel_of_a_pending_job() -> None:
    """qhold/qrls/qdel act on a waiting job (also a rescheduled Rq); a running one is refused."""
    cell = FakeCell({"12": "Rq", "13": "r"})
    q = GridEngineQueue(cell)
    held = q.hold("12")
    assert held.held and held.state == "hRq" and cell.made("qhold", "12")
    assert q.hold("12").held and cell.ran.count(["qhold", "12"]) == 1  # already held
    assert not q.release("12").held and cell.made("qrls", "12")
    with pytest.raises(SchedulerError, match=r"is r: only a job waiting.*--suspend"):
        q.hold("13")
    with pytest.raises(SchedulerError, match=r"is r: --cancel-pending.*ckptdash stop"):
        q.cancel_pending("13")
    assert q.cancel_pending("12") is None and cell.made("qdel", "12")
    with pytest.raises(SchedulerError, match="not a Grid Engine job id"):
        q.hold("12_3")


def test_suspend_switches_the_jobs_own_r_flag_and_says_so() -> None:
    """Suspend requeue sets -r n on the job (Grid Engine itself then refuses to reschedule it),
    resume -r y; the line names the command and that exit 99 still reruns."""
    cell = FakeCell({"12": "r"})
    q = GridEngineQueue(cell)
    said = q.mirror_requeue("12", False)
    assert cell.made("qalter", "-r", "n", "12") and "qalter -r n 12" in said
    assert "exit 99 still reruns it" in said
    assert q.job_view("12").describe() == "r, requeue off (-r n)"  # type: ignore[union-attr]
    q.mirror_requeue("12", True)
    assert cell.made("qalter", "-r", "y", "12") and cell.restart == "1"
    assert "no longer known" in q.mirror_requeue("99", True)


def test_status_and_refusal_as_for_slurm() -> None:
    """status --json's "scheduler" is filled for a Grid Engine job; another account's job is
    refused; an unreachable qmaster is "unavailable", not a broken job."""
    status = GridEngineQueue(FakeCell({"12": "hqw"})).job_status("12")
    assert status.to_dict() == {
        "scheduler": "gridengine",
        "job_id": "12",
        "known": True,
        "state": "hqw",
        "reason": "",
        "held": True,
        "requeue": True,
        "restarts": None,
    }
    assert status.describe() == "scheduler: gridengine job 12: hqw, held, requeue on"
    other = GridEngineQueue(FakeCell({"12": "qw"}, uid=os.geteuid() + 4242))
    with pytest.raises(SchedulerError, match="belongs to me"):
        other.verify_job("12")

    def down(argv: Sequence[str], t: float) -> tuple[int, str]:
        return (
            1,
            "error: commlib error: got select error (Connection refused)\n"
            "unable to contact qmaster",
        )

    assert GridEngineQueue(down).job_status("12").unavailable
    with pytest.raises(SchedulerUnavailable):
        GridEngineQueue(down).hold("12")


def test_a_reschedule_under_way_is_counted_and_says_so() -> None:
    """A first run whose state carries R is being rescheduled already (an operator's
    qmod -rj): ckptdash's requeue counts it, says so, and pushes nothing either."""
    cell = FakeCell({"12": "Rr"})
    first = GridEngineScheduler({**ENV, "RESTARTED": "0"}, cell).requeue()
    assert first.ok and "already being rescheduled (qstat state Rr)" in first.output
    assert not [argv for argv in cell.ran if argv[0] != "qstat"]


def test_watch_acts_on_a_grid_engine_job_through_its_queue() -> None:
    """ckptdash watch's --on actions on a Grid Engine job (on the original code every action
    was SLURM's): requeue is qmod -rj judged by its output (a refusal with exit 0 is not
    done, and says how to allow it), cancel is qdel, hold of a running job is qhold and then
    qmod -rj (it waits held as hRq), of a pending one qhold alone."""
    from ckptdash.ops.watch import act

    cell = FakeCell({"12": "r"})
    command, ok, what = act("requeue", "12", cell, scheduler="gridengine")
    assert (command, ok) == ("qmod -rj 12", True), what
    assert "Pushed rescheduling" in what and "now Rq" in what
    refusing = FakeCell({"12": "r"}, restart="2")
    command, ok, what = act("requeue", "12", refusing, scheduler="gridengine")
    assert not ok and "not restartable" in what and "qalter -r y" in what, what
    running = FakeCell({"12": "r"})
    command, ok, what = act("hold", "12", running, scheduler="gridengine")
    assert ok and command == "qhold 12; qmod -rj 12" and running.states["12"] == "hRq", what
    pending = FakeCell({"12": "qw"})
    command, ok, _ = act("hold", "12", pending, scheduler="gridengine")
    assert ok and pending.states["12"] == "hqw" and not pending.made("qmod", "-rj", "12")
    gone = FakeCell({"12": "r"})
    assert act("cancel", "12", gone, scheduler="gridengine")[:2] == ("qdel 12", True)
    assert "12" not in gone.states
    command, ok, what = act("requeue", "13", FakeCell({}), scheduler="gridengine")
    assert (command, ok) == ("qmod -rj 13", False) and "unknown to Grid Engine" in what


def test_a_requeue_inside_the_job_is_exit_99_and_pushes_no_qmod_rj(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """ckptdash's own requeue asks for exit status 99, Grid Engine's own rerun, and runs no
    qmod -rj (on the earlier code it pushed one and waited up to 60 s for its notify: a 2-rank
    parallel environment job requeued so stayed in Rt for good, tests/gridengine). It is
    recorded as ``exit 99``; a refused one asks for nothing."""
    ran = tmp_path / "ran"  # type: ignore[operator]
    fake = tmp_path / "qmod"  # type: ignore[operator]
    fake.write_text(f'#!/bin/sh\necho "$@" >> {ran}\necho "Pushed rescheduling of job $2"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    cell = FakeCell({"12": "r"})
    ge = GridEngineScheduler(ENV, cell)
    assert ge.exit_status is None
    result = ge.requeue()
    assert result == RequeueResult(True, "exit 99", 0, "Grid Engine reruns a job that exits 99")
    assert ge.exit_status == 99
    assert [argv[0] for argv in cell.ran] == ["qstat", "qstat"] and not ran.exists()
    refused = GridEngineScheduler(ENV, FakeCell({"12": "r"}, restart="2"))
    assert not refused.requeue().ok and refused.exit_status is None


@pytest.mark.process
def test_an_exit_status_request_ends_the_normal_exit_with_it(tmp_path: os.PathLike[str]) -> None:
    """exit_status.request(99): the script runs to its end, its output and logging are
    flushed, and the process exits 99 (Grid Engine's rerun), not 0."""
    import subprocess
    import sys

    log = os.path.join(tmp_path, "log.txt")
    code = (
        "import logging\nfrom ckptdash.train.ending import exit_status\n"
        f"logging.basicConfig(filename={log!r})\n"
        "exit_status.request(99)\nlogging.warning('logged')\nprint('after', flush=False)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 99, proc.stderr
    assert proc.stdout == "after\n"
    with open(log) as f:
        assert "logged" in f.read()


def test_a_job_still_in_transfer_is_rescheduled_only_once_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """qmaster may still have a running job in transfer (t) long after it started on a busy
    cell, and a qmod -rj then lost its kill order (tests/gridengine): watch's act waits until
    qstat says r before qmod -rj."""
    monkeypatch.setattr(time, "sleep", lambda s: None)
    moving = FakeCell({"12": "t"})
    real = moving.__call__

    def settles(argv: Sequence[str], t: float) -> tuple[int, str]:
        if argv[:2] == ["qstat", "-u"] and moving.ran.count(["qstat", "-u", "*"]) >= 2:
            moving.states["12"] = moving.states["12"].replace("t", "r")
        return real(argv, t)

    from ckptdash.ops.watch import act

    _, ok, what = act("requeue", "12", settles, scheduler="gridengine")
    assert ok and "now Rq" in what, what
    qstats = [i for i, a in enumerate(moving.ran) if a[:2] == ["qstat", "-u"]]
    assert len(qstats) >= 3 and moving.ran.index(["qmod", "-rj", "12"]) > qstats[2]
