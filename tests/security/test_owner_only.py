"""A run only its owner can write (issue 35): in a shared group project folder (setgid 2775,
umask 002) the owner's run folders are closed to the group, an old run's are tightened at the
owner's next attempt, a folder another account made is refused, and each way a group member
once hurt the owner through a file created inside the run (findings 1-5, 7, 8) is closed.

Two real accounts (tests/security/accounts.py). Every "old" run is made as a run of the
version before this change was (its folders group-writable, what umask 002 gave), so the
peer can plant in it; the owner's next attempt is then a real process run as the owner, one
per run that could hang (a hang is a failure at the child's timeout, never a hung suite).
One module fixture sets the scene once (about 25 s), each test checks one promise.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.security.accounts import PEER, as_user, python_as, require_accounts

owner, peer = require_accounts()

OLD = ("old", "peer_events", "kept_link", "hard_link", "pulse_fifo", "event_fifo",
       "ckpt_fifo", "runjson_copy", "pulses_link")  # fmt: skip
ALONE = ("kept_link", "hard_link", "runjson_copy", "pulses_link", "old", "peer_events")
HANGS = ("pulse_fifo", "event_fifo", "ckpt_fifo")
# The scene's attempts run as one child with a timeout each (a hang fails there, at 240 s or
# 120 s, never as a hung suite); on a loaded machine the first test's set-up, which runs them
# all, may take longer than pytest's 300 s for one test.
pytestmark = pytest.mark.timeout(1200)
SECRET = "SECRET-KEY-OF-THE-OWNER"
JOB = "4242"

# As the owner, before the peer: the run made by the previous version (group-writable
# folders), a Lightning CSV version folder with the owner's rows, the owner's SLURM log.
MAKE_OLD = """
import os, sys
runs = sys.argv[1]
for name in sys.argv[2:]:
    for d, dirs, _ in os.walk(f"{runs}/{name}"):
        os.chmod(d, 0o2775)
logs = f"{runs}/kept_link/lightning_logs/ckptdash-x"
os.makedirs(logs)
os.chmod(f"{runs}/kept_link/lightning_logs", 0o2775); os.chmod(logs, 0o2775)
with open(f"{logs}/metrics.csv", "w") as f:
    f.write("epoch,loss,step\\n0,1.0,0\\n0,0.5,1\\n0,0.25,2\\n")
with open(f"{runs}/slurm-{JOB}.out", "w") as f:
    f.write("the owner's job log\\n")
os.chmod(f"{runs}/slurm-{JOB}.out", 0o664)
""".replace("{JOB}", JOB)

# As the peer: one plant per finding.
PLANT = """
import os, sys, msgspec
from pathlib import Path
runs, home, job = sys.argv[1], sys.argv[2], sys.argv[3]

os.rename(f"{runs}/peer_events/events", f"{runs}/peer_events/events.old")
os.mkdir(f"{runs}/peer_events/events")

logs = f"{runs}/kept_link/lightning_logs/ckptdash-x"
os.symlink(f"{home}/.ssh/key", f"{logs}/metrics.csv.ckptdash-kept")

from ckptdash.events import decode_line, encode
ev = f"{runs}/hard_link/events"
first = sorted(n for n in os.listdir(ev) if ".R0000." in n)[0]
started = decode_line(Path(ev, first).read_bytes().split(b"\\n")[0] + b"\\n")
forged = msgspec.structs.replace(started, job_id=job, attempt=5, scheduler="slurm")
planted = f"{ev}/A0005.R0000.n1.1.jsonl"
os.link(f"{runs}/slurm-{job}.out", planted)  # the owner's file: fs.protected_hardlinks allows
with open(planted, "wb") as f:
    f.write(encode(forged))

os.mkfifo(f"{runs}/pulse_fifo/pulses/A0001.R0000.json")
os.mkfifo(f"{runs}/event_fifo/events/A0000.R0007.n1.1.jsonl")
os.mkfifo(f"{runs}/ckpt_fifo/checkpoints/last.ckpt")

r = f"{runs}/runjson_copy"
data = Path(r, "run.json").read_bytes()
os.unlink(f"{r}/run.json"); Path(r, "run.json").write_bytes(data)
if os.path.exists(f"{r}/snapshot"):
    os.rename(f"{r}/snapshot", f"{r}/snapshot.old")
os.mkdir(f"{r}/snapshot", 0o755)
from ckptdash.rundir import RunDir
from ckptdash.state import reading, snapshot
state, tailer = reading.open_run(RunDir(r), write=False)
print(snapshot.write(RunDir(r), state, tailer) or "written")

p = f"{runs}/pulses_link"
os.rename(f"{p}/pulses", f"{p}/pulses.old"); os.symlink(home, f"{p}/pulses")
"""


@dataclass
class Scene:
    runs: Path
    home: Path
    second: dict[str, Any]  # run name -> what the owner's next attempt printed (or "hung")
    stderr: dict[str, str]


def _attempts(specs: list[dict[str, Any]], timeout: float = 240) -> tuple[list[Any], str]:
    argv = [sys.executable, "-m", "tests.security.owner_child", json.dumps(specs)]
    try:
        proc = as_user(owner, argv, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ["hung"] * len(specs), "hung"
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")], proc.stderr


def _spec(runs: Path, name: str) -> dict[str, Any]:
    run = runs / name
    return {
        "run": str(run),
        "loggers": name == "event_fifo",
        "record": str(run / "checkpoints/last.ckpt") if name == "ckpt_fifo" else None,
        "csv": str(run / "lightning_logs/ckptdash-x") if name == "kept_link" else None,
    }


@pytest.fixture(scope="module")
def scene() -> Iterator[Scene]:
    base = Path(tempfile.mkdtemp(prefix="ckdsec-own-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        home = base / "home"
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "key").write_text(f"{SECRET}\n")
        for path in (home, home / ".ssh", home / ".ssh" / "key"):
            os.chown(path, owner.uid, owner.gid)
        os.chmod(home / ".ssh" / "key", 0o660)  # readable by the owner's group: a mistake
        os.chmod(home, 0o711)
        runs = base / "project" / "RUNS"
        runs.mkdir(parents=True)
        for folder in (runs.parent, runs):
            os.chown(folder, owner.uid, owner.gid)
            os.chmod(folder, 0o2775)
        first, _ = _attempts([{"run": str(runs / n)} for n in ("fresh", *OLD)])
        assert all("attempt" in r for r in first), first
        made = python_as(owner, MAKE_OLD, str(runs), *OLD)
        assert made.returncode == 0, made.stderr[-3000:]
        planted = python_as(peer, PLANT, str(runs), str(home), JOB)
        assert planted.returncode == 0, planted.stderr[-3000:]
        second: dict[str, Any] = {}
        stderr: dict[str, str] = {}
        results, err = _attempts([_spec(runs, n) for n in ALONE])
        for name, result in zip(ALONE, results, strict=True):
            second[name], stderr[name] = result, err
        for name in HANGS:
            (second[name],), stderr[name] = _attempts([_spec(runs, name)], timeout=120)
        yield Scene(runs, home, second, stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _folders(run: Path) -> list[Path]:
    return [Path(d) for d, _, _ in os.walk(run)]


def test_every_folder_of_a_new_run_is_the_owners_alone(scene: Scene) -> None:
    """A run the owner starts under umask 002 in a setgid group folder: every folder of it
    lacks group and other write, and the peer cannot create a file in any of them (events/,
    pulses/, control/inbox, checkpoints/, snapshot/)."""
    run = scene.runs / "fresh"
    for folder in _folders(run):
        assert not os.stat(folder).st_mode & 0o022, folder
    tried = python_as(
        peer,
        "import os, sys\nfor d in sys.argv[1:]:\n"
        "    try: open(os.path.join(d, 'x'), 'w'); print('made', d)\n"
        "    except PermissionError: pass",
        *(str(run / d) for d in ("", "events", "pulses", "control/inbox", "checkpoints")),
    )
    assert tried.returncode == 0 and tried.stdout == "", tried.stdout + tried.stderr


def test_an_old_runs_folders_are_tightened_at_the_owners_next_attempt(scene: Scene) -> None:
    """A run made before this change (group-writable folders): the owner's next attempt runs,
    removes group write from every folder of it, and says so in one line."""
    run = scene.runs / "old"
    assert scene.second["old"]["attempt"] == 1
    for folder in _folders(run):
        assert not os.stat(folder).st_mode & 0o022, folder
    said = [line for line in scene.stderr["old"].splitlines() if str(run) + "," in line]
    assert len(said) == 1 and "removed group/other write" in said[0], scene.stderr["old"]


def test_a_folder_another_account_made_is_refused_naming_it(scene: Scene) -> None:
    """events/ replaced by a folder the peer made: the owner's attempt is refused with one
    line naming the folder and its owner, and writes nothing into it."""
    run = scene.runs / "peer_events"
    why = scene.second["peer_events"].get("refused", "")
    assert f"{run}/events" in why and f"belongs to {PEER}" in why, scene.second
    assert os.listdir(run / "events") == []


def test_a_kept_csv_linked_to_the_owners_key_is_never_read(scene: Scene) -> None:
    """Finding 1: ``metrics.csv.ckptdash-kept`` a link to the owner's private key: the next
    attempt's CSV write-back never reads it; metrics.csv holds the owner's own rows (those
    before the resume step), not the key."""
    metrics = scene.runs / "kept_link/lightning_logs/ckptdash-x/metrics.csv"
    text = metrics.read_text()
    assert SECRET not in text
    assert text.splitlines()[:2] == ["epoch,loss,step", "0,1.0,0"], text
    assert not os.stat(metrics.parent).st_mode & 0o022


def test_a_hard_link_to_the_owners_log_in_events_vouches_for_no_job(scene: Scene) -> None:
    """Finding 2: the owner's group-writable SLURM log hard-linked into events/ and written
    with a run_started naming the owner's job: the evidence every SLURM action of ``watch``
    and the dashboard needs refuses it (a file with two links is not the run's own)."""
    code = (
        "import sys\nfrom ckptdash.schedulers import evidence as job_evidence\n"
        "e = job_evidence.gather(sys.argv[1], sys.argv[2])\n"
        "print(e.refusal(sys.argv[2], int(sys.argv[3])))"
    )
    said = python_as(owner, code, str(scene.runs / "hard_link"), JOB, str(owner.uid))
    assert said.returncode == 0, said.stderr
    assert said.stdout.strip(), "the hard link vouched for the job"


def test_a_fifo_pulse_record_never_hangs_the_next_attempt(scene: Scene) -> None:
    """Finding 3: a FIFO at pulses/A0001.R0000.json: the next attempt starts, trains and
    ends (the record refused, its pulses go to the log)."""
    assert scene.second["pulse_fifo"] != "hung"
    assert scene.second["pulse_fifo"]["attempt"] == 1


def test_a_fifo_event_file_never_hangs_the_logger_scan(scene: Scene) -> None:
    """Finding 4: a FIFO named like an event file: ``Monitor.loggers`` (the scan of every
    event file for earlier logger runs) returns, and the attempt trains on."""
    assert scene.second["event_fifo"] != "hung"
    assert scene.second["event_fifo"]["attempt"] == 1


def test_a_fifo_at_a_recorded_checkpoint_never_hangs_the_save(scene: Scene) -> None:
    """Finding 5: a FIFO at the path other code saved to (checkpoints/last.ckpt): recording
    it fails at once saying it is a FIFO; training goes on."""
    result = scene.second["ckpt_fifo"]
    assert result != "hung"
    assert "a FIFO" in result.get("record_error", ""), result


def test_a_snapshot_beside_a_copied_run_json_is_not_trusted(scene: Scene) -> None:
    """Finding 7: run.json replaced by the peer's byte-identical copy and a snapshot made with
    ckptdash's own code in a snapshot/ folder of the peer's: the owner's readers do not trust
    it (the owner is the run folder's), and the owner's attempt refuses the folder."""
    run = scene.runs / "runjson_copy"
    code = (
        "import sys\nfrom ckptdash.rundir import RunDir\nfrom ckptdash.state import snapshot\n"
        "r = RunDir(sys.argv[1]); o = snapshot.restore(r, r.info().run_id)\n"
        "print(o.state is None, o.why_not)"
    )
    said = python_as(owner, code, str(run))
    assert said.returncode == 0, said.stderr
    assert said.stdout.startswith("True "), said.stdout
    assert f"belongs to {PEER}" in scene.second["runjson_copy"].get("refused", "")


def test_pulses_linked_to_the_owners_home_is_never_written_through(scene: Scene) -> None:
    """Finding 8: pulses/ replaced by a link to the owner's home: the attempt is refused
    naming the link, and nothing is created in the home."""
    assert sorted(os.listdir(scene.home)) == [".ssh"]
    assert "symbolic link" in scene.second["pulses_link"].get("refused", ""), scene.second


def test_the_scene_is_the_issues(scene: Scene) -> None:
    """The project folder is the owner's, setgid and group-writable; what the peer planted
    is the peer's."""
    st = os.stat(scene.runs)
    assert st.st_uid == owner.uid and stat.S_IMODE(st.st_mode) == 0o2775
    assert os.lstat(scene.runs / "pulses_link/pulses").st_uid == peer.uid
