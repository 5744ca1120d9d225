"""A peer in a group project folder cannot plant or edit a run's snapshot (issue 24): with two
real accounts, the owner's readers ignore the peer's file and answer as a full replay does,
and the peer's own reads leave no snapshot of theirs behind."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.accounts import Account, python_as, require_accounts

OWNER_WRITES = r"""
import sys
from ckptdash import events as ev
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.reading import load_state
run = sys.argv[1]
for rank in (0, 1):
    with EventWriter(run, attempt=0, rank=rank, host=f"n{rank}") as w:
        w.emit(ev.RunStarted, t=1e9)
        for i in range(300):
            w.emit(ev.Heartbeat, step=i, t=1e9 + i, metrics={"loss": 1 / (i + 1)})
load_state(run, write_after=0)
"""

PEER_FORGES = r"""
import hashlib, json, os, sys
folder = os.path.join(sys.argv[1], "snapshot")
head, body = open(os.path.join(folder, "state-v1.json"), "rb").read().split(b"\n", 1)
doc = json.loads(body)
doc["state"]["events_total"] = 999999  # a forged count, hash recomputed: only the owner is wrong
new = json.dumps(doc).encode()
h = json.loads(head)
h["body_bytes"], h["body_sha256"] = len(new), hashlib.sha256(new).hexdigest()
tmp = os.path.join(folder, ".planted")
with open(tmp, "wb") as f:
    f.write(json.dumps(h).encode() + b"\n" + new + b"\n")
os.chmod(tmp, 0o644)
os.replace(tmp, os.path.join(folder, "state-v1.json"))
print(os.stat(os.path.join(folder, "state-v1.json")).st_uid)
"""

READS = r"""
import json, sys
from ckptdash.rundir import RunDir
from ckptdash.state import RunState, snapshot
from ckptdash.state.reading import load_state
from ckptdash.tail import RunTailer
run = RunDir(sys.argv[1])
full = RunState(str(run.root), run.info().run_id, confine=True)
for batch in RunTailer(run).batches():
    full.apply(batch)
opened = snapshot.restore(run, full.run_id)
state = load_state(run, write_after=0)
print(json.dumps({"why_not": opened.why_not, "same": state.to_dict() == full.to_dict(),
                  "events_total": state.events_total}))
"""


@pytest.fixture(scope="module")
def accounts() -> tuple[Account, Account]:
    return require_accounts()


@pytest.fixture
def run_dir(accounts: tuple[Account, Account]) -> Iterator[Path]:
    owner, _ = accounts
    base = Path(tempfile.mkdtemp(prefix="ckdsec-snap-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        runs = base / "RUNS"
        runs.mkdir()
        os.chown(runs, owner.uid, owner.gid)
        os.chmod(runs, 0o2775)  # the group project folder
        yield runs / "run"
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_snapshot_a_peer_planted_is_ignored(
    accounts: tuple[Account, Account], run_dir: Path
) -> None:
    """The owner's reader wrote RUN/snapshot/state-v1.json in a snapshot/ only the owner may
    write; in an old run's group-writable snapshot/ a peer replaces it with a forged one whose
    hash checks out. The owner's next reader refuses it (not the run owner's), answers as a
    full replay, and leaves its own snapshot in a folder closed to the group again."""
    owner, peer = accounts
    wrote = python_as(owner, OWNER_WRITES, str(run_dir))
    assert wrote.returncode == 0, wrote.stderr[-3000:]
    snap = run_dir / "snapshot" / "state-v1.json"
    assert snap.stat().st_uid == owner.uid
    assert not os.stat(snap.parent).st_mode & 0o022  # the owner's alone since issue 35
    # A run from before: snapshot/ group-writable (umask 002), so the peer can replace files.
    reopened = python_as(owner, "import os, sys; os.chmod(sys.argv[1], 0o2775)", str(snap.parent))
    assert reopened.returncode == 0, reopened.stderr
    forged = python_as(peer, PEER_FORGES, str(run_dir))
    assert forged.returncode == 0, forged.stderr[-3000:]
    assert int(forged.stdout.split()[-1]) == peer.uid
    read = python_as(owner, READS, str(run_dir))
    assert read.returncode == 0, read.stderr[-3000:]
    out = json.loads(read.stdout.splitlines()[-1])
    assert "owner" in out["why_not"] and out["same"] and out["events_total"] == 602, out
    # The owner's reader replaced the peer's file with its own.
    assert snap.stat().st_uid == owner.uid
    assert not os.stat(snap.parent).st_mode & 0o022


def test_a_peer_reading_the_run_writes_no_snapshot(
    accounts: tuple[Account, Account], run_dir: Path
) -> None:
    """A peer's `load_state` of the owner's run reads it (as a replay) and writes nothing into
    the run: only the run's owner leaves snapshots."""
    owner, peer = accounts
    wrote = python_as(
        owner, OWNER_WRITES.replace("load_state(run, write_after=0)", ""), str(run_dir)
    )
    assert wrote.returncode == 0, wrote.stderr[-3000:]
    read = python_as(peer, READS, str(run_dir))
    assert read.returncode == 0, read.stderr[-3000:]
    out = json.loads(read.stdout.splitlines()[-1])
    assert out["same"] and out["why_not"] == "no snapshot", out
    assert not (run_dir / "snapshot").exists()
