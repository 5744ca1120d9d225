"""The login-node SLURM helper and its CLI: job view, hold/release/cancel, Requeue mirroring.

A fake ``scontrol``/``scancel`` on PATH keeps a small job table in a JSON file and behaves
like SLURM 22.05 does for these commands (messages and exit status as measured on a real
cluster, see tests/slurm); every call is appended to a log the tests read.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptdash import control, events
from ckptdash.cli import main
from ckptdash.rundir.writer import EventWriter
from ckptdash.schedulers import slurm_queue
from ckptdash.state.records import AttemptInfo

REAL_LINE = (
    "JobId=12 JobName=train UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=0 Nice=0"
    " Account=(null) QOS=(null) JobState=PENDING Reason=JobHeldAdmin Dependency=(null)"
    " Requeue=1 Restarts=1 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:00"
    " TimeLimit=365-00:00:00 AllocNode:Sid=localhost:12746 NumCPUs=1 CPUs/Task=1"
    " ReqB:S:C:T=0:0:*:* TRES=cpu=1,node=1,billing=1 Socks/Node=* Command=/tmp/j.sh"
    " WorkDir=/tmp StdOut=/tmp/j-12.out Power="
)

FAKE = r'''#!@PYTHON@
"""Fake scontrol/scancel over a JSON job table: {job: {JobState, Reason, Requeue, Restarts}}."""
import json, os, sys
from pathlib import Path

table_path, log = Path(@TABLE@), Path(@LOG@)
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
with log.open("a") as f:
    f.write(" ".join([name, *args]) + "\n")
table = json.loads(table_path.read_text())
if table.get("_unavailable"):
    print(f"{name}: fatal: Could not establish a configuration source", file=sys.stderr)
    sys.exit(1)

def save():
    table_path.write_text(json.dumps(table))

def job_or_die(job, verb="slurm_load_jobs error"):
    if job not in table:
        print(f"{verb}: Invalid job id specified", file=sys.stderr)
        sys.exit(1)
    return table[job]

if name == "scancel":
    job = args[-1]
    j = job_or_die(job, "scancel: error: Kill job error on job id " + job)
    if "--state=PENDING" in args and j["JobState"] != "PENDING":
        sys.exit(0)  # filtered out, silently, like scancel --state
    j["JobState"], j["Reason"] = "CANCELLED", "None"
    save()
    sys.exit(0)

if args[:2] == ["show", "job"]:
    j = job_or_die(args[-1])
    # A job being requeued is COMPLETING for a few looks, then PENDING.
    if j["JobState"] == "COMPLETING" and j.get("settle", 0) > 0:
        j["settle"] -= 1
        if j["settle"] == 0:
            j["JobState"], j["Reason"] = "PENDING", "BeginTime"
        save()
    user = j.get("UserId", f"me({os.geteuid()})")  # the tests' own user unless set
    print(
        f"JobId={args[-1]} JobName=train UserId={user} JobState={j['JobState']}"
        f" Reason={j['Reason']} Dependency=(null) Requeue={j['Requeue']}"
        f" Restarts={j['Restarts']} BatchFlag=1"
    )
    sys.exit(0)
if args[0] in ("hold", "release"):
    j = job_or_die(args[1], "slurm_suspend error")
    if args[0] == "hold":
        if j["JobState"] != "PENDING":
            print("Job is no longer pending execution for job " + args[1], file=sys.stderr)
            sys.exit(1)
        j["Reason"] = "JobHeldAdmin"
        if j.get("starts_as_held"):  # the scheduler started it as the hold arrived
            j["JobState"] = "RUNNING"
    else:
        j["Reason"] = "None"
    save()
    sys.exit(0)
if args[0] == "update":
    job = args[1].split("=", 1)[1]
    j = job_or_die(job)
    if table.get("_update_fails"):
        print("slurm_update error: Access/permission denied", file=sys.stderr)
        sys.exit(1)
    if j["JobState"] in ("COMPLETED", "CANCELLED"):
        print("Job has already finished for job " + job, file=sys.stderr)
        sys.exit(1)
    j["Requeue"] = args[2].split("=", 1)[1]
    save()
    sys.exit(0)
print("unexpected call: " + " ".join(args), file=sys.stderr)
sys.exit(99)
'''


class FakeSlurm:
    """The fake's job table and call log."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "fakebin"
        self.bin.mkdir()
        self.table = root / "jobs.json"
        self.log = root / "slurm.log"
        self.log.touch()
        self.set({})
        text = (
            FAKE.replace("@PYTHON@", sys.executable)
            .replace("@TABLE@", repr(str(self.table)))
            .replace("@LOG@", repr(str(self.log)))
        )
        for name in ("scontrol", "scancel"):
            path = self.bin / name
            path.write_text(text)
            path.chmod(path.stat().st_mode | stat.S_IEXEC)

    def set(self, jobs: dict[str, Any]) -> None:
        self.table.write_text(json.dumps(jobs))

    def job(self, job_id: str, state: str, reason: str = "None", **extra: Any) -> None:
        table = json.loads(self.table.read_text())
        table[job_id] = {"JobState": state, "Reason": reason, "Requeue": "1", "Restarts": "1"}
        table[job_id].update(extra)
        self.table.write_text(json.dumps(table))

    def get(self, job_id: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.table.read_text())[job_id]
        return data

    def flag(self, name: str) -> None:
        table = json.loads(self.table.read_text())
        table[name] = True
        self.table.write_text(json.dumps(table))

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines()


@pytest.fixture
def slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """The fake SLURM commands first on PATH; waiting for a settling job costs nothing."""
    fake = FakeSlurm(tmp_path)
    monkeypatch.setenv("PATH", f"{fake.bin}:{'/usr/bin:/bin'}")
    monkeypatch.setattr(slurm_queue, "_sleep", lambda s: None)
    return fake


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run whose attempt 1 (SLURM job 77) requeued itself: the job now waits in the queue."""
    root = tmp_path / "exp"
    for attempt in (0, 1):
        with EventWriter(root, attempt=attempt, host="node1") as w:
            w.emit(events.RunStarted, scheduler="slurm", job_id="77", max_steps=100)
            w.emit(events.RequeueIssued, step=10, job_id="77", command="scontrol requeue 77")
            w.emit(events.RunFinished, step=10, reason="preempted")
    return root


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


# --- the module ------------------------------------------------------------------------------


def test_parse_show_job_reads_a_real_line() -> None:
    """Keys with ':' and '/', values holding '=' and empty values parse as scontrol prints them."""
    fields = slurm_queue.parse_show_job(REAL_LINE + "\n")
    assert fields["JobState"] == "PENDING"
    assert fields["Reason"] == "JobHeldAdmin"
    assert fields["TRES"] == "cpu=1,node=1,billing=1"
    assert fields["AllocNode:Sid"] == "localhost:12746"
    assert fields["CPUs/Task"] == "1"
    assert fields["Power"] == ""


def test_job_view_states(slurm: FakeSlurm) -> None:
    """A held pending job reads as held with its reason; an unknown job is None."""
    slurm.job("77", "PENDING", "JobHeldAdmin")
    view = slurm_queue.job_view("77")
    assert view is not None
    assert (view.pending, view.held, view.finished) == (True, True, False)
    assert (view.requeue, view.restarts) == (True, 1)
    assert view.describe() == "PENDING (JobHeldAdmin), held, requeue on, restarts 1"
    assert slurm_queue.job_view("78") is None
    assert slurm.calls() == ["scontrol show job -o 77", "scontrol show job -o 78"]


def test_unavailable_slurm_is_its_own_error(
    slurm: FakeSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No configuration or no scontrol on PATH: SlurmUnavailable, saying what to do."""
    slurm.flag("_unavailable")
    with pytest.raises(slurm_queue.SlurmUnavailable, match="SLURM_CONF"):
        slurm_queue.job_view("77")
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    with pytest.raises(slurm_queue.SlurmUnavailable, match="not on PATH"):
        slurm_queue.job_view("77")


@pytest.mark.parametrize("bad", ["", "12;rm -rf /", "-1", "abc", "12_", "12_3_4"])
def test_job_ids_are_checked_before_any_command(slurm: FakeSlurm, bad: str) -> None:
    """Anything but `123` or `123_4` is refused with the expected form, and nothing runs."""
    with pytest.raises(slurm_queue.SlurmError, match="not a SLURM job id"):
        slurm_queue.hold(bad)
    assert slurm.calls() == []


def test_hold_and_release_a_pending_job(slurm: FakeSlurm) -> None:
    """hold → scontrol hold (JobHeldAdmin); release → scontrol release; each is idempotent."""
    slurm.job("77", "PENDING", "BeginTime")
    assert slurm_queue.hold("77").held
    assert slurm_queue.hold("77").held  # already held: no second scontrol hold
    assert not slurm_queue.release("77").held
    assert not slurm_queue.release("77").held
    verbs = [c for c in slurm.calls() if "show job" not in c]
    assert verbs == ["scontrol hold 77", "scontrol release 77"]


def test_hold_waits_for_a_job_that_is_being_requeued(slurm: FakeSlurm) -> None:
    """Right after a requeue the job is COMPLETING for a moment: hold waits for PENDING."""
    slurm.job("77", "COMPLETING", settle=3)
    assert slurm_queue.hold("77").held
    assert "scontrol hold 77" in slurm.calls()


def test_hold_refuses_a_running_job(slurm: FakeSlurm) -> None:
    """Only a waiting job can be held; the message points to --suspend for a running one."""
    slurm.job("77", "RUNNING")
    with pytest.raises(slurm_queue.SlurmError, match=r"is RUNNING.*--suspend"):
        slurm_queue.hold("77")


def test_a_hold_that_lands_as_the_job_starts_is_taken_back(slurm: FakeSlurm) -> None:
    """The job was pending when ckptdash looked and started as the hold arrived (a real
    cluster showed RUNNING, Reason=JobHeldAdmin): the hold is released, so the next requeue
    does not silently wait held, and the error says the job is running."""
    slurm.job("77", "PENDING", "BeginTime", starts_as_held=True)
    with pytest.raises(slurm_queue.SlurmError, match=r"is RUNNING: it started before the hold"):
        slurm_queue.hold("77")
    verbs = [c for c in slurm.calls() if "show job" not in c]
    assert verbs == ["scontrol hold 77", "scontrol release 77"]
    assert slurm.get("77")["Reason"] == "None"


def test_cancel_pending_cancels_only_a_waiting_job(slurm: FakeSlurm) -> None:
    """A pending job is cancelled with `scancel --state=PENDING`; a running one is refused."""
    slurm.job("77", "PENDING", "JobHeldAdmin")
    after = slurm_queue.cancel_pending("77")
    assert after is not None
    assert after.state == "CANCELLED"
    assert "scancel --state=PENDING 77" in slurm.calls()
    slurm.job("78", "RUNNING")
    with pytest.raises(slurm_queue.SlurmError, match=r"is RUNNING.*ckptdash stop"):
        slurm_queue.cancel_pending("78")


def test_set_requeue_mirrors_onto_live_jobs_only(slurm: FakeSlurm) -> None:
    """Requeue=0/1 on a running or pending job; a finished or forgotten job is left alone."""
    slurm.job("77", "RUNNING")
    view = slurm_queue.set_requeue("77", False)
    assert view is not None
    assert view.requeue is False
    assert slurm.get("77")["Requeue"] == "0"
    assert slurm_queue.set_requeue("77", False) is not None  # already 0: no second update
    slurm_queue.set_requeue("77", True)
    assert slurm.get("77")["Requeue"] == "1"
    slurm.job("79", "COMPLETED")
    done = slurm_queue.set_requeue("79", False)
    assert done is not None
    assert done.finished
    assert slurm_queue.set_requeue("80", False) is None
    updates = [c for c in slurm.calls() if c.startswith("scontrol update")]
    assert updates == ["scontrol update JobId=77 Requeue=0", "scontrol update JobId=77 Requeue=1"]


def test_mirror_requeue_says_what_it_did_in_one_line(slurm: FakeSlurm) -> None:
    """The line the CLI prints and the dashboard shows: set, nothing to do, or not set and why;
    a refusal raises with the manual fix (the run's own setting is already changed)."""
    slurm.job("77", "PENDING", "JobHeldAdmin")
    assert slurm_queue.mirror_requeue("77", False).startswith(
        "slurm job 77: Requeue=0 (PENDING (JobHeldAdmin), held, requeue off (Requeue=0)"
    )
    slurm.job("79", "COMPLETED")
    assert slurm_queue.mirror_requeue("79", False) == "slurm job 79: COMPLETED; nothing to mirror"
    assert "no longer known to SLURM" in slurm_queue.mirror_requeue("80", True)
    slurm.flag("_update_fails")
    with pytest.raises(slurm_queue.SlurmError, match=r"Requeue=1`$") as failed:
        slurm_queue.mirror_requeue("77", True)
    assert "the run's setting is changed (auto-requeue on)" in str(failed.value)
    slurm.flag("_unavailable")
    said = slurm_queue.mirror_requeue("77", True)
    assert said.startswith("slurm job 77: Requeue=1 not set: ")


def test_job_of_is_the_newest_attempt_with_a_slurm_job() -> None:
    """The job the controls act on: the newest attempt's that SLURM ran (not a local one)."""
    A = AttemptInfo
    assert slurm_queue.job_of([]) is None
    attempts = [A(1, scheduler="slurm", job_id="12_3"), A(0, scheduler="slurm", job_id="11")]
    assert slurm_queue.job_of(attempts) == "12_3"
    assert slurm_queue.job_of([*attempts, A(2, scheduler="local", job_id="999")]) == "12_3"
    assert slurm_queue.job_of([A(0, scheduler="slurm", job_id=None)]) is None


# --- the CLI ---------------------------------------------------------------------------------


def test_cli_suspend_and_resume_mirror_onto_the_job(
    slurm: FakeSlurm, run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`requeue --suspend` sets the run's setting and Requeue=0 on its job; --resume undoes both."""
    slurm.job("77", "RUNNING")
    assert main(["requeue", str(run), "--suspend"]) == 0
    assert control.read_settings(run).requeue_suspended
    assert slurm.get("77")["Requeue"] == "0"
    assert "slurm job 77: Requeue=0 (RUNNING, requeue off (Requeue=0)" in capsys.readouterr().out
    assert main(["requeue", str(run), "--resume"]) == 0
    assert not control.read_settings(run).requeue_suspended
    assert slurm.get("77")["Requeue"] == "1"


def test_cli_suspend_without_slurm_changes_the_run_and_says_so(
    slurm: FakeSlurm, run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Away from the cluster the setting still changes (the job reads it); one line says
    the job's flag was not set and why; exit 0."""
    slurm.flag("_unavailable")
    assert main(["requeue", str(run), "--suspend"]) == 0
    assert control.read_settings(run).requeue_suspended
    out = capsys.readouterr().out
    assert "slurm job 77: Requeue=0 not set" in out
    assert "Could not establish a configuration source" in out


def test_cli_failed_mirror_is_one_line_exit_2(
    slurm: FakeSlurm, run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A live job whose flag cannot be set: exit 2, one line with the job and the manual fix."""
    slurm.job("77", "RUNNING")
    slurm.flag("_update_fails")
    assert main(["requeue", str(run), "--suspend"]) == 2
    err = one_line_error(capsys)
    assert "slurm job 77" in err
    assert "scontrol update JobId=77 Requeue=0" in err
    assert control.read_settings(run).requeue_suspended  # the run's own setting did change


def test_cli_hold_release_cancel(
    slurm: FakeSlurm, run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--hold / --release / --cancel-pending --yes act on the run's latest job."""
    slurm.job("77", "PENDING", "BeginTime")
    assert main(["requeue", str(run), "--hold"]) == 0
    assert slurm.get("77")["Reason"] == "JobHeldAdmin"
    assert main(["requeue", str(run), "--release"]) == 0
    assert slurm.get("77")["Reason"] == "None"
    assert main(["requeue", str(run), "--cancel-pending", "--yes"]) == 0
    assert slurm.get("77")["JobState"] == "CANCELLED"
    out = capsys.readouterr().out
    assert "slurm job 77: held" in out
    assert "slurm job 77: released" in out
    assert "slurm job 77: cancelled while pending" in out


@pytest.mark.parametrize(
    ("argv", "state", "message"),
    [
        (["--hold"], "RUNNING", "slurm job 77 is RUNNING"),
        (["--cancel-pending", "--yes"], "RUNNING", "slurm job 77 is RUNNING"),
        (["--cancel-pending"], "PENDING", "add --yes to confirm"),
        (["--release", "--job", "12;x"], "PENDING", "not a SLURM job id"),
        (["--hold", "--job", "99"], "PENDING", "SLURM does not know this job"),
        (["--suspend", "--yes"], "PENDING", "--yes only confirms --cancel-pending"),
    ],
)
def test_cli_scheduler_errors_are_one_line_exit_2(
    slurm: FakeSlurm,
    run: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    state: str,
    message: str,
) -> None:
    """Every refusal names the job (or value) and what to do instead; no traceback."""
    slurm.job("77", state)
    assert main(["requeue", str(run), *argv]) == 2
    assert message in one_line_error(capsys)
    assert slurm.get("77")["JobState"] == state


def test_cli_control_needs_a_job(
    slurm: FakeSlurm, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run with no SLURM job recorded: --hold says to name one with --job."""
    root = tmp_path / "local"
    EventWriter(root, attempt=0).close()
    assert main(["requeue", str(root), "--hold"]) == 2
    assert "--job JOBID" in one_line_error(capsys)
    slurm.job("5", "PENDING")
    assert main(["requeue", str(root), "--hold", "--job", "5"]) == 0


def test_status_shows_the_scheduler_view_next_to_the_events(
    slurm: FakeSlurm, run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status` adds SLURM's view of the run's job (held, pending, reason) to the table and
    to --json; --no-scheduler leaves SLURM alone."""
    slurm.job("77", "PENDING", "JobHeldAdmin")
    assert main(["status", str(run)]) == 0
    out = capsys.readouterr().out
    assert "scheduler: slurm job 77: PENDING (JobHeldAdmin), held, requeue on, restarts 1" in out
    assert "requeue attempt 1 issued: scontrol requeue 77" in out
    assert main(["status", str(run), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["scheduler"] == {
        "scheduler": "slurm",
        "job_id": "77",
        "known": True,
        "state": "PENDING",
        "reason": "JobHeldAdmin",
        "held": True,
        "requeue": True,
        "restarts": 1,
    }
    before = len(slurm.calls())
    assert main(["status", str(run), "--no-scheduler"]) == 0
    assert "scheduler:" not in capsys.readouterr().out
    assert len(slurm.calls()) == before


def test_status_when_slurm_forgot_the_job_or_is_unreachable(
    slurm: FakeSlurm, run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A purged job and an unreachable controller each read as one line, never an error."""
    assert main(["status", str(run)]) == 0
    assert "scheduler: slurm job 77: no longer known to SLURM" in capsys.readouterr().out
    slurm.flag("_unavailable")
    assert main(["status", str(run), "--json"]) == 0
    view = json.loads(capsys.readouterr().out)["scheduler"]
    assert "Could not establish a configuration source" in view["error"]


def test_status_of_a_folder_asks_an_unreachable_slurm_once(
    slurm: FakeSlurm, run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """For a folder of runs an unreachable controller is asked once, not once per run."""
    for name in ("exp2", "exp3"):
        with EventWriter(run.parent / name, attempt=0) as w:
            w.emit(events.RunStarted, scheduler="slurm", job_id="78", max_steps=10)
    slurm.flag("_unavailable")
    assert main(["status", str(run.parent), "--json"]) == 0
    views = [r["scheduler"] for r in json.loads(capsys.readouterr().out)["runs"]]
    assert len(views) == 3
    assert all("Could not establish" in v["error"] for v in views)
    assert len(slurm.calls()) == 1


# --- acting only on the user's own job, started by the run --------------------------------


def test_verify_job_accepts_the_runs_own_job(slurm: FakeSlurm, run: Path) -> None:
    """Job 77 runs as this user and the run's rank-0 files (this user's) open with a
    run_started naming it: verify_job answers SLURM's view."""
    slurm.job("77", "PENDING")
    view = slurm_queue.verify_job("77", run_root=run)
    assert view is not None
    assert view.pending


def test_verify_job_refuses_another_users_job(slurm: FakeSlurm, run: Path) -> None:
    """SLURM says the job runs as another account: refused, naming that account, with or
    without the run's evidence."""
    slurm.job("77", "PENDING", UserId="alice(4242)")
    for root in (run, None):
        with pytest.raises(slurm_queue.SlurmRefused, match=r"belongs to alice \(uid 4242\)"):
            slurm_queue.verify_job("77", run_root=root)


def test_verify_job_refuses_a_job_the_run_did_not_start(
    slurm: FakeSlurm, run: Path, tmp_path: Path
) -> None:
    """The user's own job 78, which no run_started of this run names, is refused for this
    run; an answer about another job id, or without a UserId, is refused too."""
    slurm.job("78", "PENDING")
    with pytest.raises(slurm_queue.SlurmRefused, match=r"no run_started in .* names job 78"):
        slurm_queue.verify_job("78", run_root=run)
    assert slurm_queue.verify_job("78") is not None  # named by the user: theirs, so fine
    # A line planted after the run_started (not the file's first line) vouches for nothing.
    planted = run / "events" / "A0005.R0000.x.1.jsonl"
    planted.write_text('{"kind":"pulse"}\n')
    with pytest.raises(slurm_queue.SlurmRefused):
        slurm_queue.verify_job("78", run_root=run)
    slurm.job("79", "PENDING", UserId="(null)")
    with pytest.raises(slurm_queue.SlurmRefused, match="did not say whose job"):
        slurm_queue.verify_job("79")

    def other_job(argv: Any, timeout_s: float) -> tuple[int, str]:
        return 0, f"JobId=80 UserId=me({os.geteuid()}) JobState=PENDING"

    with pytest.raises(slurm_queue.SlurmRefused, match="answered about job 80"):
        slurm_queue.verify_job("77", runner=other_job)


def test_verify_job_matches_an_array_task(slurm: FakeSlurm, tmp_path: Path) -> None:
    """An array task recorded as 12_3 is the job SLURM shows as JobId=14 ArrayJobId=12
    ArrayTaskId=3."""
    root = tmp_path / "arr"
    with EventWriter(root, attempt=0) as w:
        w.emit(events.RunStarted, scheduler="slurm", job_id="12_3")

    def task(argv: Any, timeout_s: float) -> tuple[int, str]:
        uid = os.geteuid()
        return 0, f"JobId=14 ArrayJobId=12 ArrayTaskId=3 UserId=me({uid}) JobState=RUNNING"

    view = slurm_queue.verify_job("12_3", run_root=root, runner=task)
    assert view is not None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown files")
def test_verify_job_refuses_a_run_started_written_by_another_account(
    slurm: FakeSlurm, run: Path
) -> None:
    """A group member plants A0009.R0000 (their file) naming the owner's unrelated job 90 in
    the owner's run: the newest attempt now names 90, but nothing the job's user wrote does;
    an events/ folder of another account vouches for nothing either."""
    slurm.job("90", "PENDING")
    slurm.job("77", "PENDING")
    with EventWriter(run, attempt=9) as w:
        w.emit(events.RunStarted, scheduler="slurm", job_id="90")
    (planted,) = (run / "events").glob("A0009.R0000.*")
    os.chown(planted, 4242, 4242)
    with pytest.raises(slurm_queue.SlurmRefused, match=r"written by uid 4242"):
        slurm_queue.verify_job("90", run_root=run)
    os.chown(run / "events", 4242, 4242)
    with pytest.raises(slurm_queue.SlurmRefused, match=r"events belongs to uid 4242"):
        slurm_queue.verify_job("77", run_root=run)


def test_cli_refuses_another_users_job_and_runs_nothing(
    slurm: FakeSlurm, run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`requeue --hold` and the `--suspend` mirror on a run whose job SLURM says is another
    account's: exit 2, one line saying whose it is; no hold, no update ran (the run's own
    setting still changes with --suspend, as the line says)."""
    slurm.job("77", "PENDING", UserId="alice(4242)")
    assert main(["requeue", str(run), "--hold"]) == 2
    assert "belongs to alice (uid 4242)" in one_line_error(capsys)
    assert main(["requeue", str(run), "--suspend"]) == 2
    err = one_line_error(capsys)
    assert "belongs to alice" in err
    assert "the run's setting is changed, the job's Requeue flag is not" in err
    assert [c for c in slurm.calls() if "show job" not in c] == []
    assert slurm.get("77")["Reason"] == "None"
