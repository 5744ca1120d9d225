"""Opening a run from its snapshot plus the tail gives exactly what a full replay gives, and a
snapshot that cannot be trusted (corrupt, of another version or run, planted, stale, for files
rewritten since) is ignored: the reader replays."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptdash import events as ev
from ckptdash.analysis import goodput, health
from ckptdash.cli.status import render_status
from ckptdash.rundir import RunDir
from ckptdash.rundir.pulses import PulseRecordWriter, record_name
from ckptdash.rundir.writer import EventWriter
from ckptdash.state import RunState, snapshot
from ckptdash.state.reading import load_state, open_run
from ckptdash.tail import MAX_LINE_BYTES, RunTailer

NOW = 1_700_100_000.0
T0 = 1_700_000_000.0


def replay(run: RunDir) -> RunState:
    """A full replay, as every reader did before snapshots."""
    state = RunState(str(run.root), run.info().run_id, confine=True)
    for batch in RunTailer(run).batches():
        state.apply(batch)
    return state


def answers(run: RunDir, state: RunState) -> tuple[Any, ...]:
    """What the readers print of a state: status --json's dict, status, health, goodput."""
    th = health.Thresholds()
    return (
        state.to_dict(),
        render_status(run, state, now=NOW),
        [repr(a) for a in health.detect(state, th, NOW)],
        repr(goodput.of_state(state, NOW)),
    )


# --- random logs --------------------------------------------------------------------------------

WRITERS = ((0, 0), (0, 1), (1, 0), (1, 1))
KINDS = (
    "heartbeat",
    "pulse",
    "run_started",
    "run_resumed",
    "run_finished",
    "run_failed",
    "checkpoint_started",
    "checkpoint_saved",
    "checkpoint_failed",
    "checkpoint_removed",
    "checkpoint_dir_declared",
    "signal_received",
    "command_received",
    "command_applied",
    "exception",
    "alert_raised",
    "anomaly",
    "logger_attached",
)


def _event(cls_kind: str, step: int, n: int, root: Path) -> tuple[type[ev.Event], dict[str, Any]]:
    path = str(root / "checkpoints" / f"c{n % 3}.ckpt") if n % 5 else f"/elsewhere/c{n % 2}.ckpt"
    cid = f"cmd{n % 3}"
    table: dict[str, tuple[type[ev.Event], dict[str, Any]]] = {
        "heartbeat": (ev.Heartbeat, {"metrics": {"loss": step / 7, "lr": 0.1}, "epoch": n % 2}),
        "pulse": (ev.Pulse, {}),
        "run_started": (ev.RunStarted, {"world_size": 2, "job_id": str(n)}),
        "run_resumed": (ev.RunResumed, {"path": path, "reason": "newest valid"}),
        "run_finished": (ev.RunFinished, {"reason": "completed" if n % 2 else "requeue"}),
        "run_failed": (ev.RunFailed, {"error": f"boom {n}"}),
        "checkpoint_started": (ev.CheckpointStarted, {"path": path, "trigger": "periodic"}),
        "checkpoint_saved": (
            ev.CheckpointSaved,
            {"path": path, "trigger": "periodic", "size_bytes": n, "duration_s": 0.5},
        ),
        "checkpoint_failed": (
            ev.CheckpointFailed,
            {"path": path, "trigger": "signal", "error": "disk full"},
        ),
        "checkpoint_removed": (ev.CheckpointRemoved, {"path": path, "reason": "pruned"}),
        "checkpoint_dir_declared": (ev.CheckpointDirDeclared, {"path": f"/scratch/d{n % 2}"}),
        "signal_received": (ev.SignalReceived, {"signal": "SIGUSR1", "action": "requeue"}),
        "command_received": (ev.CommandReceived, {"command_id": cid, "command": "save_now"}),
        "command_applied": (
            ev.CommandApplied,
            {"command_id": cid, "command": "save_now", "detail": path},
        ),
        "exception": (ev.ExceptionRaised, {"error_type": "ValueError", "message": str(n)}),
        "alert_raised": (ev.AlertRaised, {"alert": "stale", "since": T0}),
        "anomaly": (ev.AnomalyDetected, {"metric": "loss", "value": None, "reason": "nan"}),
        "logger_attached": (ev.LoggerAttached, {"logger": "tb", "id": str(n)}),
    }
    return table[cls_kind]


OPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("event"),
            st.integers(0, len(WRITERS) - 1),
            st.sampled_from(KINDS),
            st.integers(0, 40),  # step
            st.integers(0, 3),  # time step: 0 makes ties
        ),
        st.tuples(st.just("snapshot")),
        st.tuples(st.just("torn"), st.integers(0, len(WRITERS) - 1)),
        st.tuples(st.just("garbage"), st.integers(0, len(WRITERS) - 1)),
        st.tuples(st.just("long"), st.integers(0, len(WRITERS) - 1)),
        st.tuples(st.just("record"), st.integers(0, len(WRITERS) - 1), st.integers(0, 40)),
        st.tuples(st.just("bad_record"), st.integers(0, len(WRITERS) - 1)),
        st.tuples(st.just("truncate"), st.integers(0, len(WRITERS) - 1)),
        st.tuples(st.just("rotate"), st.integers(0, len(WRITERS) - 1)),
    ),
    min_size=1,
    max_size=40,
)


class Log:
    """A run written with the real writer, plus the damage a killed or meddling writer leaves."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.run = RunDir(root)
        self.writers: dict[int, EventWriter] = {}
        self.torn: dict[int, bytes] = {}  # the rest of a half-written line, per writer
        self.records: dict[int, PulseRecordWriter] = {}
        self.record_steps: dict[int, tuple[int, float]] = {}  # (step, since) last written
        self.t = T0
        self.n = 0
        self.changed = False  # a file the snapshot read was cut short or replaced since
        self.offsets: dict[str, int] = {}  # how far the last snapshot read (or searched) each file
        self.sizes: dict[str, int] = {}  # and each file's size then
        self.unsure = False  # cut, but not below what it read: refused only if mtime moved

    def writer(self, i: int) -> EventWriter:
        if i not in self.writers:
            attempt, rank = WRITERS[i]
            self.writers[i] = EventWriter(self.run, attempt=attempt, rank=rank, host=f"n{rank}")
        w = self.writers[i]
        if i in self.torn:
            os.write(w._fd, self.torn.pop(i))  # type: ignore[arg-type]
        return w

    def event(self, i: int, kind: str, step: int, dt: int) -> None:
        self.t += dt
        self.n += 1
        cls, fields = _event(kind, step, self.n, self.root)
        self.writer(i).emit(cls, step=step, t=self.t, **fields)

    def tear(self, i: int) -> None:
        w = self.writer(i)
        self.t += 1
        line = ev.encode(ev.Heartbeat(t=self.t, run=w.run_id, attempt=w.attempt, rank=w.rank))
        cut = len(line) // 2
        os.write(w._fd, line[:cut])  # type: ignore[arg-type]
        self.torn[i] = line[cut:]

    def record(self, i: int, step: int) -> None:
        """The rank's pulse record rewritten in place (rundir/pulses), as its pulse thread does."""
        w = self.writer(i)
        if i not in self.records:
            self.records[i] = PulseRecordWriter(
                self.root, run=w.run_id, attempt=w.attempt, rank=w.rank, host=w.host
            )
        self.t += 1
        # As the pulse thread writes it: the step never goes back, and ``since`` is when the
        # rank reached it (a record whose ``since`` moves on at one step is not one a job
        # writes; a replay and a follower would then disagree too).
        last_step, since = self.record_steps.get(i, (-1, self.t))
        if step <= last_step:
            step = last_step
        else:
            since = self.t
        self.record_steps[i] = (step, since)
        self.records[i].write(t=self.t, step=step, since=since)

    def bad_record(self, i: int) -> None:
        """A record of another attempt under this one's name: reported, never counted."""
        attempt, rank = WRITERS[i]
        folder = self.root / "pulses"
        folder.mkdir(exist_ok=True)
        (folder / record_name(attempt, rank + 7)).write_bytes(b"junk" * 10)

    def long(self, i: int) -> None:
        """A line already over the tailer's cap, its end still to come: a snapshot now records
        how far the tailer searched for its newline."""
        w = self.writer(i)
        os.write(w._fd, b"x" * (MAX_LINE_BYTES + 64))  # type: ignore[arg-type]
        self.torn[i] = b"y" * 64 + b"\n"

    def garbage(self, i: int) -> None:
        os.write(self.writer(i)._fd, b'{"kind": "heartbeat", "t": oops}\n')  # type: ignore[arg-type]

    def truncate(self, i: int) -> None:
        w = self.writer(i)
        size = os.path.getsize(w.path)
        if size:
            os.truncate(w.path, size // 2)
            self.torn.pop(i, None)
            name = w.path.name
            self.changed |= size // 2 < self.offsets.get(name, 0)
            self.unsure |= name in self.offsets and size // 2 <= self.sizes[name]

    def rotate(self, i: int) -> None:
        """The file replaced by a copy of itself (another inode, the same bytes)."""
        w = self.writer(i)
        tmp = w.path.with_name(".copy")
        shutil.copyfile(w.path, tmp)
        os.replace(tmp, w.path)
        self.writers.pop(i).close()
        self.torn.pop(i, None)
        self.changed |= w.path.name in self.offsets


@settings(
    max_examples=int(os.environ.get("SNAPSHOT_EXAMPLES", "25")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS)
def test_snapshot_plus_tail_equals_a_full_replay(ops: list[tuple[Any, ...]]) -> None:
    """For random logs of every event kind on four files, cut at random points with snapshots
    taken in between (torn last lines, bad lines, oversize lines cut in two, truncated and
    replaced files, pulse records rewritten in place and bad ones included), a
    reader opening from the snapshot and the tail says exactly what a full replay says:
    ``status --json``'s state, ``status``, ``health`` and ``goodput``."""
    with tempfile.TemporaryDirectory() as tmp:
        log = Log(Path(tmp) / "run")
        log.run.ensure()
        taken = False  # a snapshot was taken, and no file it read was changed since
        for op in ops:
            if op[0] == "event":
                log.event(*op[1:])
            elif op[0] == "snapshot":
                state, tailer = open_run(log.run, write_after=-1)
                assert answers(log.run, state) == answers(log.run, replay(log.run))
                if snapshot.why_not_write(log.run, state, tailer) == "":  # it was written
                    taken, log.changed, log.unsure = True, False, False
                    log.offsets = {n: p.offset + p.scanned for n, p in tailer.positions().items()}
                    log.sizes = {n: (log.run.events / n).stat().st_size for n in log.offsets}
            else:
                getattr(log, {"torn": "tear"}.get(op[0], op[0]))(*op[1:])
        full = replay(log.run)
        opened = snapshot.restore(log.run, full.run_id)
        if not log.unsure or log.changed:
            assert (opened.state is not None) == (taken and not log.changed), opened.why_not
        state = load_state(log.run, write=False)
        assert answers(log.run, state) == answers(log.run, full)
        for w in log.writers.values():
            w.close()
        for r in log.records.values():
            r.close()


# --- a snapshot is used, and only when it may be -----------------------------------------------


def _run(tmp_path: Path, beats: int = 200) -> RunDir:
    run = RunDir(tmp_path / "run")
    with EventWriter(run, attempt=0, host="n0") as w:
        w.emit(ev.RunStarted, t=T0)
        for i in range(beats):
            w.emit(ev.Heartbeat, step=i, t=T0 + i, metrics={"loss": 1 / (i + 1)})
    return run


def _append(run: RunDir, n: int = 5) -> None:
    with EventWriter(run, attempt=0, rank=1, host="n1") as w:
        for i in range(n):
            w.emit(ev.Pulse, step=i, t=T0 + 500 + i)


def test_a_snapshot_is_written_used_and_equals_a_replay(tmp_path: Path) -> None:
    """A reader that read more than the threshold writes RUN/snapshot/state-v1.json (mode
    0644, the run owner's); the next reader restores it, reads only what was appended since,
    and gets the replay's answer."""
    run = _run(tmp_path)
    load_state(run, write_after=0)
    path = Path(snapshot.snapshot_path(run))
    st_ = path.stat()
    assert stat.S_IMODE(st_.st_mode) == 0o644 and st_.st_uid == os.geteuid()
    _append(run)
    opened = snapshot.restore(run, run.info().run_id)
    assert opened.why_not == "" and opened.read_from > 0
    assert load_state(run, write=False).to_dict() == replay(run).to_dict()


def _tamper(run: RunDir, edit: Any) -> None:
    path = Path(snapshot.snapshot_path(run))
    data = path.read_bytes()
    head, body = data.split(b"\n", 1)
    path.chmod(0o644)
    path.write_bytes(edit(head, body))


def _header(change: dict[str, Any]) -> Any:
    def edit(head: bytes, body: bytes) -> bytes:
        h = json.loads(head)
        h.update(change)
        return json.dumps(h).encode() + b"\n" + body

    return edit


def _body_state(change: Any) -> Any:
    """Rewrite the body (and its hash, so only the body's meaning is wrong)."""

    def edit(head: bytes, body: bytes) -> bytes:
        import hashlib

        doc = json.loads(body)
        change(doc)
        new = json.dumps(doc).encode()
        h = json.loads(head)
        h["body_bytes"], h["body_sha256"] = len(new), hashlib.sha256(new).hexdigest()
        return json.dumps(h).encode() + b"\n" + new + b"\n"

    return edit


HOSTILE = {
    "torn body": lambda head, body: head + b"\n" + body[: len(body) // 2],
    "flipped byte": lambda head, body: head + b"\n" + body.replace(b"heartbeat", b"heartbeaT", 1),
    "no header": lambda head, body: b"x" * 5000,
    "not json": lambda head, body: b"\x00\xff garbage\n" + body,
    "another version": _header({"version": 2}),
    "another ckptdash": _header({"code": "0" * 32}),
    "another run": _header({"run_id": "someoneelse"}),
    "a forged offset": _body_state(
        lambda d: [r.update(offset=r["offset"] - 10) for r in d["files"].values()]
    ),
    "a negative offset": _body_state(lambda d: [r.update(offset=-1) for r in d["files"].values()]),
    "an offset past the end": _body_state(
        lambda d: [r.update(offset=r["size"] + 100) for r in d["files"].values()]
    ),
    "a count that is not a number": _body_state(
        lambda d: d["state"].update(event_counts={"heartbeat": "many"})
    ),
    "a stream slot of the wrong type": _body_state(
        lambda d: d["state"]["attempts"]["0"][1]["0"].__setitem__(3, "x")
    ),
    "a stream with a slot too many": _body_state(
        lambda d: d["state"]["attempts"]["0"][1]["0"].append(0)
    ),
    "a body of the old tagged format": _body_state(
        lambda d: d.update(state={"_attempts": ["D"], "events_total": 0})
    ),
    "a body of another schema": _body_state(lambda d: d["state"].update(schema=1)),
    "an attempt holding another's record": _body_state(
        lambda d: d["state"]["attempts"]["0"][0].update(attempt=5)
    ),
    "a file name with a slash": _body_state(
        lambda d: d["files"].update({"../x": next(iter(d["files"].values()))})
    ),
    "an unknown event kind": _body_state(
        lambda d: d["state"].update(best_hb=[[True, 1.0, 0, 0], {"kind": "os.system"}])
    ),
    "a missing attribute": _body_state(lambda d: d["state"].pop("events_total")),
    "a wrong type": _body_state(lambda d: d["state"].update(events_total="many")),
    "deep nesting": lambda head, body: _rehash(
        head,
        body.replace(b'"bad_heap":[]', b'"bad_heap":' + b"[" * 200_000 + b"0" + b"]" * 200_000),
    ),
    "a huge list": lambda head, body: _rehash(
        head, body.replace(b'"bad_heap":[]', b'"bad_heap":[' + b"[]," * 20_000 + b"[]]")
    ),
}


def _rehash(head: bytes, body: bytes) -> bytes:
    import hashlib

    body = body.rstrip(b"\n")
    h = json.loads(head)
    h["body_bytes"], h["body_sha256"] = len(body), hashlib.sha256(body).hexdigest()
    return json.dumps(h).encode() + b"\n" + body + b"\n"


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_snapshot_that_cannot_be_trusted_is_ignored(tmp_path: Path, case: str) -> None:
    """Corrupt, torn, of another format version, ckptdash version or run, or with forged
    contents: the snapshot is not restored and the reader's answer is a full replay's."""
    run = _run(tmp_path)
    load_state(run, write_after=0)
    _tamper(run, HOSTILE[case])
    _append(run)
    opened = snapshot.restore(run, run.info().run_id)
    assert opened.state is None and opened.why_not
    assert load_state(run, write=False).to_dict() == replay(run).to_dict()


def test_rewritten_event_files_make_the_snapshot_stale(tmp_path: Path) -> None:
    """An event file truncated, replaced by another inode, removed, or rewritten in place
    with other bytes of the same length since the snapshot: the snapshot is refused."""
    for how in ("truncate", "replace", "remove", "in place"):
        where = tmp_path / how
        run = _run(where)
        load_state(run, write_after=0)
        (f,) = run.events.iterdir()
        data = f.read_bytes()
        if how == "truncate":
            os.truncate(f, len(data) // 2)
        elif how == "replace":
            tmp = f.with_name(".x")
            tmp.write_bytes(data)
            os.replace(tmp, f)
        elif how == "remove":
            f.unlink()
        else:
            with open(f, "r+b") as fh:
                fh.seek(len(data) - 30)
                fh.write(b"9" if data[len(data) - 30 : len(data) - 29] != b"9" else b"8")
        opened = snapshot.restore(run, run.info().run_id)
        assert opened.state is None, how
        assert load_state(run, write=False).to_dict() == replay(run).to_dict()


def test_a_snapshot_not_the_owners_alone_is_ignored(tmp_path: Path, monkeypatch: Any) -> None:
    """A snapshot writable by the group, or owned by another account than run.json's (a peer
    in a shared group folder planting one), is never restored; a symbolic link in its place
    is not followed; a reader that is not the run's owner writes none."""
    run = _run(tmp_path)
    load_state(run, write_after=0)
    path = Path(snapshot.snapshot_path(run))
    path.chmod(0o664)
    assert "owner" in snapshot.restore(run, run.info().run_id).why_not
    path.chmod(0o644)
    assert snapshot.restore(run, run.info().run_id).state is not None
    monkeypatch.setattr(snapshot, "run_owner", lambda run: os.geteuid() + 1)  # a peer's file
    assert "owner" in snapshot.restore(run, run.info().run_id).why_not
    state, tailer = open_run(run, write=False)
    assert "owner" in snapshot.write(run, state, tailer)
    monkeypatch.undo()
    real = tmp_path / "elsewhere.json"
    path.rename(real)
    path.symlink_to(real)
    assert "symbolic link" in snapshot.restore(run, run.info().run_id).why_not


def test_a_reader_of_a_small_tail_leaves_the_snapshot_alone(tmp_path: Path) -> None:
    """Below the threshold no snapshot is written: a small run costs no extra write."""
    run = _run(tmp_path, beats=20)
    load_state(run)
    assert not Path(snapshot.snapshot_path(run)).exists()


def test_watch_and_the_dashboard_follower_open_from_the_snapshot(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """`ckptdash watch` and the dashboard's follower restore the run's snapshot, read only the
    tail, and hold what a replay holds; one that read more than the threshold leaves a fresh
    snapshot behind (here the threshold is 0)."""
    from ckptdash.dash.feed.follow import RunFollower
    from ckptdash.ops.watch import Watch

    monkeypatch.setattr(snapshot, "SNAPSHOT_AFTER_BYTES", 0)
    run = _run(tmp_path)
    path = Path(snapshot.snapshot_path(run))
    watch = Watch(run.root, clock=lambda: T0 + 300)
    watch.poll()
    watch.close()
    assert path.exists()  # the watch's first look wrote it
    _append(run)
    before = path.stat().st_mtime_ns
    watch = Watch(run.root, clock=lambda: T0 + 300)
    watch.poll()
    (opened,) = watch._set.open.values()
    watch.close()
    assert opened.covered > 0 and path.stat().st_mtime_ns != before
    assert opened.state.to_dict() == replay(run).to_dict()
    _append(run, 3)
    follower = RunFollower(run.root, mode="poll")
    follower._discover()
    (followed,) = follower._runs.open.values()
    assert 0 < followed.covered < sum(f.stat().st_size for f in run.events.iterdir())
    follower._poll()
    assert followed.state.to_dict() == replay(run).to_dict()


def test_a_snapshot_taken_inside_an_oversize_line_goes_on_skipping_it(tmp_path: Path) -> None:
    """A snapshot taken while the tailer searches for the end of a line over its cap records
    how far it searched; the next reader goes on from there and counts the line oversize once,
    as a replay does."""
    log = Log(tmp_path / "run")
    log.run.ensure()
    log.event(0, "heartbeat", 1, 1)
    log.long(0)
    state, tailer = open_run(log.run, write_after=-1)
    (pos,) = tailer.positions().values()
    assert pos.scanned > MAX_LINE_BYTES
    log.event(0, "heartbeat", 2, 1)  # ends the long line first
    assert snapshot.restore(log.run, state.run_id).state is not None
    restored = load_state(log.run, write=False)
    assert restored.bad_lines.counts == {"oversize": 1}
    assert answers(log.run, restored) == answers(log.run, replay(log.run))
    log.writers[0].close()


def test_a_snapshot_folder_swapped_for_a_link_is_neither_read_nor_written(tmp_path: Path) -> None:
    """RUN/snapshot replaced by a symbolic link to a folder holding a valid snapshot: the
    reader does not follow it (it replays), and a writer does not write through it."""
    run = _run(tmp_path)
    load_state(run, write_after=0)
    folder = run.root / "snapshot"
    elsewhere = tmp_path / "elsewhere"
    folder.rename(elsewhere)
    folder.symlink_to(elsewhere, target_is_directory=True)
    before = (elsewhere / "state-v1.json").read_bytes()
    assert "link" in snapshot.restore(run, run.info().run_id).why_not
    _append(run)
    state, tailer = open_run(run, write=False)
    assert "link" in snapshot.write(run, state, tailer)
    assert (elsewhere / "state-v1.json").read_bytes() == before
    assert state.to_dict() == replay(run).to_dict()
