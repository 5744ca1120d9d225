"""The incremental reader: only new bytes, only whole lines, never a crash."""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable
from multiprocessing.context import ForkContext, SpawnContext
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ckptdash import events, tail
from ckptdash.events import BadLine, Event, Heartbeat, SaveNow, encode, encode_command
from ckptdash.rundir import TEMP_PREFIX, RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.tail import CommandFile, RunTailer, TailBatch

T0 = 1_764_430_000.0

# Every kind with every field set away from its default; a new kind must be added here.
SAMPLES: dict[str, dict[str, Any]] = {
    "logger_attached": {"logger": "wandb", "id": "ckptdash-3f2a91c0d4e1", "redone": "dropped"},
    "run_started": {
        "scheduler": "slurm",
        "job_id": "4242",
        "world_size": 8,
        "pid": 77,
        "max_steps": 1000,
        "requeue_budget": 3,
    },
    "run_resumed": {"path": "checkpoints/step=100.ckpt", "reason": "newest valid"},
    "run_finished": {"reason": "requeue"},
    "run_failed": {"error": "CUDA out of memory"},
    "heartbeat": {
        "epoch": 3,
        "metrics": events.encode_metrics({"loss": 0.25, "lr": 1e-3}),
        "time_left_s": 120.5,
    },
    "checkpoint_started": {"path": "checkpoints/last.ckpt", "trigger": "signal"},
    "checkpoint_saved": {
        "path": "checkpoints/last.ckpt",
        "trigger": "periodic",
        "size_bytes": 52_428_800,
        "duration_s": 0.41,
        "checksum": "xxh3_128:00ff",
        "epoch": 2,
    },
    "checkpoint_failed": {"path": "c/x.ckpt", "trigger": "exception", "error": "disk full"},
    "checkpoint_removed": {"path": "c/x.ckpt", "reason": "rotation"},
    "checkpoint_invalid": {"path": "c/x.ckpt", "reason": "size 3 != 10"},
    "checkpoint_dir_declared": {"path": "/scratch/ckpt"},
    "control_failed": {"reason": "done/ is not writable", "command_id": "c1"},
    "signal_received": {"signal": "SIGUSR2", "action": "save_requeue"},
    "requeue_issued": {"job_id": "4242", "command": "scontrol requeue 4242"},
    "requeue_skipped": {"reason": "requeue suspended"},
    "command_received": {"command_id": "c1", "command": "save_now"},
    "command_applied": {"command_id": "c1", "command": "save_now", "detail": "c/x.ckpt"},
    "command_rejected": {"command_id": "c2", "reason": "malformed", "command": "save_now"},
    "command_expired": {"command_id": "c3", "reason": "ttl", "command": "stop_after_save"},
    "exception": {"error_type": "ValueError", "message": "bad", "traceback": "Traceback…"},
    "anomaly": {
        "metric": "loss",
        "value": 81.5,
        "reason": "spike: 81.5 > 5 x median 2.1",
        "action": "rollback",
        "pinned": "checkpoints/step=100.ckpt",
    },
    "pulse": {},
    "alert_raised": {
        "alert": "hung",
        "since": T0,
        "detail": "no step for 300 s",
        "source": "watch",
        "who": "ana@login1",
    },
    "alert_cleared": {"alert": "hung", "detail": "step 12", "source": "job", "who": "rank 1"},
    "action_taken": {
        "alert": "hung",
        "action": "requeue",
        "command": "scontrol requeue 4242",
        "ok": True,
        "result": "exit 0",
        "source": "watch",
        "who": "ana@login1",
    },
}


def heartbeat(w: EventWriter, step: int) -> Event:
    return w.emit(Heartbeat, step=step, t=T0 + step, metrics={"loss": 1.0 / (step + 1)})


def steps(batch: TailBatch) -> list[int | None]:
    return [e.step for e in batch.events]


def append(path: Path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


# --- the schema, read back ---------------------------------------------------------------------


def test_every_kind_round_trips(run_dir: RunDir) -> None:
    """Each kind in EVENT_TYPES, written by EventWriter with every field set, reads back equal."""
    assert set(SAMPLES) == set(events.KINDS), "add the new kind to SAMPLES"
    with EventWriter(run_dir, attempt=1, rank=2, host="n7") as w:
        written = [
            w.emit(cls, step=10 + i, t=T0 + i, **SAMPLES[cls.KIND])
            for i, cls in enumerate(events.EVENT_TYPES)
        ]
    batch = RunTailer(run_dir).poll()
    assert batch.bad == []
    assert batch.events == written
    assert [type(e) for e in batch.events] == list(events.EVENT_TYPES)


def test_poll_returns_only_what_is_new(run_dir: RunDir) -> None:
    """A second poll returns nothing; after more writes it returns only the new events."""
    tailer = RunTailer(run_dir)
    with EventWriter(run_dir, attempt=0) as w:
        first = [heartbeat(w, i) for i in range(3)]
        assert tailer.poll().events == first
        assert not tailer.poll()
        second = [heartbeat(w, i) for i in range(3, 5)]
        assert tailer.poll().events == second


# --- concurrency -------------------------------------------------------------------------------


def _read_until(tailer: RunTailer, n: int, done: Callable[[], bool]) -> list[TailBatch]:
    """Poll in a loop until ``n`` events came back, or the writer is done and a poll is empty."""
    got: list[TailBatch] = []
    count = 0
    pause = threading.Event()
    while count < n:
        finished = done()
        batch = tailer.poll()
        got.append(batch)
        count += len(batch.events)
        if finished and not batch:
            break
        pause.wait(0.0005)
    return got


def test_reader_polls_while_a_thread_writes(run_dir: RunDir) -> None:
    """A reader polling while a thread appends 5000 events reads each exactly once, in order."""
    n = 5000
    writer = EventWriter(run_dir, attempt=0)
    thread = threading.Thread(target=lambda: [heartbeat(writer, i) for i in range(n)])
    tailer = RunTailer(run_dir)
    thread.start()
    try:
        batches = _read_until(tailer, n, lambda: not thread.is_alive())
    finally:
        thread.join(timeout=30)
        writer.close()
    assert [s for b in batches for s in steps(b)] == list(range(n))
    assert all(b.bad == [] for b in batches)
    assert len([b for b in batches if b.events]) > 1, "the reader should have overlapped the writer"


def _mp() -> ForkContext | SpawnContext:
    # fork is fast and needs no importable test module; spawn where fork does not exist.
    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _write_in_process(root: str, n: int) -> None:
    with EventWriter(root, attempt=0, host="child") as w:
        for i in range(n):
            heartbeat(w, i)


def test_reader_polls_while_another_process_writes(run_dir: RunDir) -> None:
    """A writer in another process appending 5000 events: each is read exactly once, in order."""
    n = 5000
    proc = _mp().Process(target=_write_in_process, args=(str(run_dir.root), n))
    tailer = RunTailer(run_dir)
    proc.start()
    try:
        batches = _read_until(tailer, n, lambda: not proc.is_alive())
    finally:
        proc.join(timeout=30)
    assert proc.exitcode == 0
    assert [s for b in batches for s in steps(b)] == list(range(n))
    assert all(b.bad == [] for b in batches)


# --- torn, corrupt and unknown lines -------------------------------------------------------------


def test_torn_last_line_waits_for_its_newline(run_dir: RunDir) -> None:
    """A half-written last line is not parsed; once the rest and the newline arrive it is, once."""
    tailer = RunTailer(run_dir)
    with EventWriter(run_dir, attempt=0) as w:
        first = [heartbeat(w, i) for i in range(2)]
    third = Heartbeat(t=T0 + 2, run=w.run_id, attempt=0, step=2)
    line = encode(third)
    append(w.path, line[:25])
    batch = tailer.poll()
    assert batch.events == first and batch.bad == []
    assert tailer.pending_bytes == {w.path.name: 25}
    append(w.path, line[25:-1])  # everything but the newline: still not a line
    assert not tailer.poll()
    append(w.path, b"\n" + b"{not json\n")
    batch = tailer.poll()
    assert batch.events == [third]
    assert [(b.line, b.reason) for b in batch.bad] == [(4, "corrupt")]  # line numbers still right
    assert tailer.pending_bytes == {}


def test_corrupt_line_in_the_middle_is_counted_and_skipped(run_dir: RunDir) -> None:
    """A corrupt line mid-file becomes one 'corrupt' BadLine; the lines after it are still read."""
    with EventWriter(run_dir, attempt=0) as w:
        before = heartbeat(w, 0)
        append(w.path, b'{"kind":"heartbeat","t":17\n')
        after = [heartbeat(w, i) for i in range(1, 4)]
    batch = RunTailer(run_dir).poll()
    assert batch.events == [before, *after]
    assert batch.bad == [BadLine(w.path.name, 2, "corrupt", '{"kind":"heartbeat","t":17')]


def test_unknown_kind_is_counted_and_extra_fields_are_tolerated(run_dir: RunDir) -> None:
    """An unknown kind is an 'unknown_kind' BadLine; an extra field on a known kind is ignored."""
    with EventWriter(run_dir, attempt=0) as w:
        known = heartbeat(w, 0)
    obj = msgspec.json.decode(encode(known))
    append(w.path, msgspec.json.encode({**obj, "kind": "gpu_melted"}) + b"\n")
    append(w.path, msgspec.json.encode({**obj, "gpu_temp_c": 71}) + b"\n")
    batch = RunTailer(run_dir).poll()
    assert batch.events == [known, known]
    assert [(b.line, b.reason, b.detail) for b in batch.bad] == [(2, "unknown_kind", "gpu_melted")]


@pytest.mark.parametrize(("read_bytes", "decode_bytes"), [(64, 32), (300, 100), (4096, 1)])
def test_small_reads_and_pieces_change_nothing(
    run_dir: RunDir, read_bytes: int, decode_bytes: int
) -> None:
    """Reads and decode pieces shorter than a line give the same events and line numbers."""
    with EventWriter(run_dir, attempt=0) as w:
        written = [heartbeat(w, i) for i in range(50)]
        append(w.path, b"garbage\n")
        written.append(heartbeat(w, 50))
    batch = RunTailer(run_dir, read_bytes=read_bytes, decode_bytes=decode_bytes).poll()
    assert batch.events == written
    assert [(b.line, b.reason) for b in batch.bad] == [(51, "corrupt")]


def test_byte_budget_splits_a_poll_without_losing_a_line(run_dir: RunDir) -> None:
    """poll(max_bytes) stops at a line boundary, says so, and the next poll continues there."""
    with EventWriter(run_dir, attempt=0) as w:
        written = [heartbeat(w, i) for i in range(200)]
    tailer = RunTailer(run_dir, decode_bytes=1000)
    got: list[Event] = []
    polls = 0
    while True:
        got.extend(tailer.poll(max_bytes=3000).events)
        polls += 1
        if tailer.caught_up:
            break
        assert polls < 1000
    assert got == written and polls > 2


def test_batches_hands_out_pieces_in_order(run_dir: RunDir) -> None:
    """batches() yields the same events as one poll, split into pieces of about decode_bytes."""
    with EventWriter(run_dir, attempt=0) as w:
        written = [heartbeat(w, i) for i in range(200)]
    pieces = list(RunTailer(run_dir, decode_bytes=2000).batches())
    assert len(pieces) > 5
    assert [e for p in pieces for e in p.events] == written


# --- files appearing, shrinking and unreadable ---------------------------------------------------


def test_new_attempt_file_appearing_mid_tail_is_read(run_dir: RunDir) -> None:
    """An event file created after tailing started is found at the next poll, from its start."""
    tailer = RunTailer(run_dir)
    with EventWriter(run_dir, attempt=0) as w0:
        a0 = [heartbeat(w0, i) for i in range(3)]
    assert tailer.poll().events == a0
    with EventWriter(run_dir, attempt=1) as w1:
        a1 = [heartbeat(w1, i) for i in range(3, 6)]
    assert tailer.poll().events == a1


def test_files_come_in_name_order(run_dir: RunDir) -> None:
    """Within one poll, files are read in sorted name order (attempt, then rank), lines in order."""
    with (
        EventWriter(run_dir, attempt=1, rank=0) as a1,
        EventWriter(run_dir, attempt=0, rank=1) as a0r1,
        EventWriter(run_dir, attempt=0, rank=0) as a0r0,
    ):
        e = [heartbeat(a1, 0), heartbeat(a0r1, 1), heartbeat(a0r0, 2), heartbeat(a1, 3)]
    assert RunTailer(run_dir).poll().events == [e[2], e[1], e[0], e[3]]


def test_truncated_file_is_read_again_and_reported(run_dir: RunDir) -> None:
    """A file that shrank is re-read from its start, counted in restarts, and reported once."""
    tailer = RunTailer(run_dir)
    with EventWriter(run_dir, attempt=0) as w:
        written = [heartbeat(w, i) for i in range(3)]
    assert tailer.poll().events == written
    w.path.write_bytes(encode(written[0]))
    batch = tailer.poll()
    assert batch.events == written[:1]
    assert [(b.file, b.reason) for b in batch.bad] == [(w.path.name, "invalid")]
    assert "shrank" in batch.bad[0].detail and tailer.restarts == 1
    assert not tailer.poll()


def test_unreadable_event_file_is_reported_once_then_read(
    run_dir: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event file that cannot be opened gives one BadLine, not one per poll; later it is read."""
    with EventWriter(run_dir, attempt=0) as w:
        written = [heartbeat(w, i) for i in range(3)]

    def refuse(path: Any, *args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(tail, "open_regular", refuse)
    tailer = RunTailer(run_dir)
    batch = tailer.poll()
    assert batch.events == []
    assert [(b.file, b.line, b.reason) for b in batch.bad] == [(w.path.name, 0, "invalid")]
    assert "Permission denied" in batch.bad[0].detail
    assert not tailer.poll()
    monkeypatch.undo()
    assert tailer.poll().events == written


def test_missing_events_folder_is_just_empty(tmp_path: Path) -> None:
    """Tailing a run directory before training created it returns empty batches."""
    tailer = RunTailer(tmp_path / "not-yet")
    assert not tailer.poll()
    assert len(tailer.poll()) == 0


# --- command files -----------------------------------------------------------------------------


def command_file(run_dir: RunDir, cid: str, **fields: Any) -> Path:
    cmd = SaveNow(id=cid, t=T0, author="ada", host="login1", **fields)
    path = run_dir.inbox / f"{cid}.json"
    path.write_bytes(encode_command(cmd))
    return path


def test_command_file_is_reported_when_it_appears_and_when_it_moves(run_dir: RunDir) -> None:
    """Inbox, then claimed, then done: one CommandFile each time, with the parsed command."""
    tailer = RunTailer(run_dir)
    path = command_file(run_dir, "c1", expires_at=T0 + 60)
    (seen,) = tailer.poll().commands
    assert (seen.id, seen.location, seen.error) == ("c1", "inbox", None)
    assert seen.command == SaveNow(id="c1", t=T0, author="ada", host="login1", expires_at=T0 + 60)
    assert seen.mtime == path.stat().st_mtime
    assert not tailer.poll()
    os.rename(path, run_dir.claimed / path.name)
    assert [(c.location, c.command) for c in tailer.poll().commands] == [("claimed", seen.command)]
    os.rename(run_dir.claimed / path.name, run_dir.done / path.name)
    assert [c.location for c in tailer.poll().commands] == ["done"]
    assert not tailer.poll()


def test_malformed_command_file_carries_the_parse_error(run_dir: RunDir) -> None:
    """A file that does not parse is reported with command None and the reason in error."""
    (run_dir.inbox / "bad.json").write_bytes(b'{"command": "format_disk"}')
    (run_dir.inbox / "c2.json").write_bytes(
        encode_command(SaveNow(id="c9", t=T0, author="a", host="h"))
    )
    got = {c.id: c for c in RunTailer(run_dir).poll().commands}
    assert got["bad"].command is None and "not a ckptdash command" in (got["bad"].error or "")
    assert got["c2"].command is None and "named after 'c2'" in (got["c2"].error or "")


def test_temp_and_nfs_files_in_the_inbox_are_ignored(run_dir: RunDir) -> None:
    """Half-made temp files and NFS silly-renames are not commands."""
    (run_dir.inbox / f"{TEMP_PREFIX}c1.json.1.ab").write_bytes(b"{")
    (run_dir.inbox / ".nfs000000001").write_bytes(b"{")
    assert RunTailer(run_dir).poll().commands == []


def _folder(directory: Any) -> Path:
    """The folder ``os.listdir`` was given: a path, or a held directory descriptor (the control
    folders are listed through descriptors, never through a path a link could redirect)."""
    if isinstance(directory, int):
        return Path(os.readlink(f"/proc/self/fd/{directory}"))
    return Path(directory)


def test_command_file_moving_during_the_listing_is_followed(
    run_dir: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file listed in the inbox but claimed before it is opened is found in claimed/."""
    path = command_file(run_dir, "c1")
    os.rename(path, run_dir.claimed / path.name)
    real_listdir = os.listdir

    def stale(directory: Any) -> list[str]:  # the listing as it was just before the claim
        if _folder(directory) == run_dir.inbox:
            return [path.name]
        if _folder(directory) == run_dir.claimed:
            return []
        return real_listdir(directory)

    monkeypatch.setattr(os, "listdir", stale)
    assert [(c.id, c.location) for c in RunTailer(run_dir).poll().commands] == [("c1", "claimed")]


def test_command_file_vanishing_is_looked_for_at_the_next_poll(
    run_dir: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listed file that is gone everywhere is skipped quietly and reported once it exists."""
    real_listdir = os.listdir

    def ghost(directory: Any) -> list[str]:
        names = real_listdir(directory)
        return [*names, "c1.json"] if _folder(directory) == run_dir.inbox else names

    monkeypatch.setattr(os, "listdir", ghost)
    tailer = RunTailer(run_dir)
    assert tailer.poll().commands == []
    monkeypatch.undo()
    command_file(run_dir, "c1")
    assert [c.id for c in tailer.poll().commands] == ["c1"]


def test_unreadable_command_file_is_reported_with_the_error(
    run_dir: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A command file that cannot be opened is reported with the OS error, never raised."""
    path = command_file(run_dir, "c1")
    real_open = os.open

    def refuse(file: Any, *args: Any, **kwargs: Any) -> int:
        if Path(file) == path:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    (seen,) = RunTailer(run_dir).poll().commands
    assert seen.command is None and "Permission denied" in (seen.error or "")


def test_fifo_in_the_inbox_does_not_hang(run_dir: RunDir) -> None:
    """A FIFO posing as a command is reported as not a regular file (opened non-blocking)."""
    os.mkfifo(run_dir.inbox / "pipe.json")
    (seen,) = RunTailer(run_dir).poll().commands
    assert seen.command is None and "not a regular file" in (seen.error or "")


def test_batch_len_and_truth(run_dir: RunDir) -> None:
    """len() counts events, bad lines and command files; an empty batch is falsy."""
    cf = CommandFile("c1", "inbox", None, "x", 0.0)
    batch = TailBatch(bad=[BadLine("f", 1, "corrupt", "")], commands=[cf])
    assert len(batch) == 2 and batch and not TailBatch()


def test_an_abandoned_batches_iterator_never_reads_twice(run_dir: RunDir) -> None:
    """A poll after an unfinished batches() continues from the last piece; the old one stops."""
    with EventWriter(run_dir, attempt=0) as w:
        written = [heartbeat(w, i) for i in range(100)]
    tailer = RunTailer(run_dir, decode_bytes=1000)
    pieces = tailer.batches()
    first = next(pieces).events
    rest = tailer.poll().events
    assert first + rest == written
    assert list(pieces) == []
