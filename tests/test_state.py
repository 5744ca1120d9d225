"""The run state: built only by replaying records, the same whatever order files interleave in."""

from __future__ import annotations

import ast
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from ckptdash import events
from ckptdash import state as state_module
from ckptdash.events import (
    BadLine,
    CheckpointFailed,
    CheckpointInvalid,
    CheckpointRemoved,
    CheckpointSaved,
    CheckpointStarted,
    CommandApplied,
    CommandExpired,
    CommandReceived,
    CommandRejected,
    Event,
    ExceptionRaised,
    Heartbeat,
    RequeueIssued,
    RequeueSkipped,
    RunFailed,
    RunFinished,
    RunResumed,
    RunStarted,
    SaveNow,
    SignalReceived,
    StopAfterSave,
    encode_command,
)
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.state import RunState
from ckptdash.state.series import SERIES_POINTS
from ckptdash.tail import CommandFile, RunTailer, TailBatch

T0 = 1_764_430_000.0


def ev(kind: type[Event], t: float, *, attempt: int = 0, rank: int = 0, **fields: Any) -> Event:
    """An event as the writer would make it, at time ``T0 + t``."""
    if kind is Heartbeat and isinstance(fields.get("metrics"), dict):
        fields["metrics"] = events.encode_metrics(fields["metrics"])
    return kind(t=T0 + t, run="r1", attempt=attempt, rank=rank, host=f"n{rank}", **fields)


def saved(t: float, path: str, step: int, **fields: Any) -> Event:
    fields = {"trigger": "periodic", "size_bytes": 100 + step, "duration_s": 0.5, **fields}
    return ev(CheckpointSaved, t, path=path, step=step, checksum=f"xxh3_128:{step:x}", **fields)


def replay(*records: Event | CommandFile | BadLine) -> RunState:
    """A fresh state fed ``records`` one at a time, in the given order."""
    state = RunState("run", "r1")
    for r in records:
        if isinstance(r, CommandFile):
            state.apply(TailBatch(commands=[r]))
        elif isinstance(r, BadLine):
            state.apply(TailBatch(bad=[r]))
        else:
            state.apply(TailBatch(events=[r]))
    return state


# --- a realistic run, written by the real writer -------------------------------------------------


def write_run(run: RunDir) -> None:
    """Two ranks, two attempts, every kind, command files in every folder, a few bad lines."""
    w0 = EventWriter(run, attempt=0, rank=0, host="n1")
    w1 = EventWriter(run, attempt=0, rank=1, host="n2")
    w0.emit(RunStarted, t=T0, scheduler="slurm", job_id="42", world_size=2, max_steps=900, pid=7)
    w1.emit(RunStarted, t=T0 + 0.001, scheduler="slurm", job_id="42", world_size=2)
    for i in range(1, 301):
        t = T0 + i * 0.3
        w0.emit(Heartbeat, step=i, t=t, epoch=i // 100, metrics={"loss": 1 / i}, time_left_s=9e3)
        w1.emit(Heartbeat, step=i, t=t + 0.01, epoch=i // 100, metrics={"loss": 2 / i})
        if i % 50 == 0:
            path = f"checkpoints/step={i}.ckpt"
            w0.emit(CheckpointStarted, step=i, t=t + 0.02, path=path, trigger="periodic")
            for p in (path, "checkpoints/last.ckpt"):
                w0.emit(
                    CheckpointSaved,
                    step=i,
                    t=t + 0.1,
                    path=p,
                    trigger="periodic",
                    size_bytes=1000 + i,
                    duration_s=0.08,
                    checksum=f"xxh3_128:{i:x}",
                    epoch=i // 100,
                )
    t = T0 + 100
    w0.emit(CommandReceived, step=300, t=t, command_id="c1", command="save_now")
    w0.emit(CommandApplied, step=300, t=t + 1, command_id="c1", command="save_now", detail="x")
    w0.emit(SignalReceived, step=300, t=t + 2, signal="SIGUSR2", action="save_requeue")
    w1.emit(SignalReceived, step=300, t=t + 2, signal="SIGUSR2", action="save_requeue")
    w0.emit(RequeueIssued, step=300, t=t + 3, job_id="42", command="scontrol requeue 42")
    w0.emit(RunFinished, step=300, t=t + 4, reason="requeue")
    w1.emit(RunFinished, step=300, t=t + 4.001, reason="requeue")
    w0.close()
    w1.close()
    with EventWriter(run, attempt=1, rank=0, host="n3") as w:
        w.emit(RunStarted, t=T0 + 200, scheduler="slurm", job_id="42", world_size=1)
        w.emit(RunResumed, step=300, t=T0 + 201, path="checkpoints/step=300.ckpt", reason="newest")
        for i in range(301, 341):
            w.emit(Heartbeat, step=i, t=T0 + 202 + (i - 300) * 0.5, metrics={"loss": 0.1})
        w.emit(CommandRejected, t=T0 + 230, command_id="c2", reason="malformed")
        w.emit(CommandExpired, t=T0 + 231, command_id="c3", reason="claimer died")
        w.emit(CheckpointFailed, step=340, t=T0 + 232, path="c/s.ckpt", trigger="manual", error="x")
        w.emit(CheckpointRemoved, t=T0 + 233, path="checkpoints/step=50.ckpt", reason="rotation")
        w.emit(CheckpointInvalid, t=T0 + 234, path="checkpoints/step=100.ckpt", reason="size 3")
        w.emit(ExceptionRaised, step=340, t=T0 + 235, error_type="ValueError", message="nan")
        w.emit(RequeueSkipped, step=340, t=T0 + 236, reason="budget spent")
        w.emit(RunFailed, step=340, t=T0 + 237, error="ValueError: nan")
    with open(w.path, "ab") as f:
        f.write(b"{torn\n" + b'{"kind":"from_the_future","t":1}\n')
    cmd = encode_command(SaveNow(id="c1", t=T0 + 99, author="ada", host="login1"))
    (run.done / "c1.json").write_bytes(cmd)
    (run.done / "c2.json").write_bytes(b"not json")
    stop = StopAfterSave(id="c3", t=T0 + 150, author="bob", host="login2", expires_at=T0 + 160)
    (run.claimed / "c3.json").write_bytes(encode_command(stop))
    cmd = encode_command(SaveNow(id="c4", t=T0 + 300, author="ada", host="login1"))
    (run.inbox / "c4.json").write_bytes(cmd)


@pytest.fixture(scope="module")
def written_run(tmp_path_factory: pytest.TempPathFactory) -> RunDir:
    run = RunDir(tmp_path_factory.mktemp("state") / "run")
    write_run(run)
    return run


def whole_replay(run: RunDir) -> RunState:
    state = RunState(str(run.root), run.info().run_id)
    for batch in RunTailer(run).batches():
        state.apply(batch)
    return state


def test_realistic_run_reads_as_expected(written_run: RunDir) -> None:
    """A two-attempt run reads as what happened: outcomes, checkpoints, commands, counts."""
    state = whole_replay(written_run)
    a0, a1 = state.attempts[0], state.attempts[1]
    assert (a0.outcome, a0.end_reason, a0.host, a0.job_id, a0.world_size) == (
        "stopped",
        "requeue",
        "n1",
        "42",
        2,
    )
    assert (a0.started_at, a0.ended_at, a0.ranks, a0.step) == (T0, T0 + 104, [0, 1], 300)
    assert a0.last_heartbeat_t == T0 + 104.001  # rank 1's run_finished is the last of the attempt
    assert (a1.outcome, a1.end_reason, a1.resumed_from) == (
        "failed",
        "ValueError: nan",
        "checkpoints/step=300.ckpt",
    )
    ckpts = state.checkpoints
    assert (
        ckpts["checkpoints/last.ckpt"].step == 300 and ckpts["checkpoints/last.ckpt"].replaced == 5
    )
    assert ckpts["checkpoints/step=50.ckpt"].status == "removed"
    assert ckpts["checkpoints/step=100.ckpt"].status == "invalid"
    assert ckpts["c/s.ckpt"].status == "failed"
    assert ckpts["checkpoints/step=150.ckpt"].started_at == T0 + 150 * 0.3 + 0.02
    assert [c.step for c in state.valid_checkpoints()] == [150, 200, 250, 300, 300]
    assert {i: c.status for i, c in state.commands.items()} == {
        "c1": "applied",
        "c2": "rejected",
        "c3": "expired",
        "c4": "pending",
    }
    assert state.commands["c3"].author == "bob" and state.commands["c3"].expires_at == T0 + 160
    assert state.bad_lines.counts == {"corrupt": 1, "unknown_kind": 1}
    assert state.event_counts["heartbeat"] == 640 and state.events_total == sum(
        state.event_counts.values()
    )
    assert len(state.signals) == 2 and [r.issued for r in state.requeues] == [True, False]
    assert state.exceptions[0].message == "nan"
    assert state.progress is not None
    assert (state.progress.attempt, state.progress.step) == (1, 340)  # from run_failed's step
    assert state.run_id == written_run.info().run_id
    json.dumps(state.to_dict())  # JSON-ready


def interleaved_replay(run: RunDir, seed: int) -> RunState:
    """Replay like a live tailer might: small chunks of each file, files interleaved at random."""
    rng = random.Random(seed)
    queues: list[list[TailBatch]] = []
    for path in run.event_files():
        records = events.decode_lines(path.read_bytes(), file=path.name)
        chunks: list[TailBatch] = []
        while records:
            n = rng.randint(1, 40)
            part, records = records[:n], records[n:]
            chunks.append(
                TailBatch(
                    events=[r for r in part if not isinstance(r, BadLine)],
                    bad=[r for r in part if isinstance(r, BadLine)],
                )
            )
        queues.append(chunks)
    queues.append([TailBatch(commands=[c]) for c in RunTailer(run).poll().commands])
    state = RunState(str(run.root), run.info().run_id)
    while any(queues):
        queue = rng.choice([q for q in queues if q])
        state.apply(queue.pop(0))
    return state


@pytest.mark.parametrize("seed", range(8))
def test_interleaving_does_not_change_the_state(written_run: RunDir, seed: int) -> None:
    """Whole files replayed in order and small chunks interleaved at random give equal to_dict()."""
    assert interleaved_replay(written_run, seed).to_dict() == whole_replay(written_run).to_dict()


def test_replaying_twice_gives_the_same_state(written_run: RunDir) -> None:
    """Two fresh replays of one run directory are equal, and reversed file order changes nothing."""
    first = whole_replay(written_run)
    assert whole_replay(written_run).to_dict() == first.to_dict()
    backwards = RunState(str(written_run.root), written_run.info().run_id)
    tailer = RunTailer(written_run)
    batches = list(tailer.batches())
    for batch in reversed(batches):
        backwards.apply(batch)
    assert backwards.to_dict() == first.to_dict()


# --- checkpoints -------------------------------------------------------------------------------


def test_a_newer_save_of_the_same_path_replaces_the_record() -> None:
    """last.ckpt saved twice is one record with the newer save; the older one is no candidate."""
    older, newer = saved(1, "last.ckpt", 100), saved(2, "last.ckpt", 200)
    for order in ((older, newer), (newer, older)):
        state = replay(*order)
        (info,) = state.valid_checkpoints()
        assert (info.path, info.step, info.t, info.size_bytes) == ("last.ckpt", 200, T0 + 2, 300)
        assert info.replaced == 1 and state.replaced == 1


def test_checkpoint_status_follows_its_events_by_time() -> None:
    """saving → saved; a later failed or running save keeps a saved file valid; removed, invalid."""
    start = ev(CheckpointStarted, 1, path="a", trigger="signal", step=5)
    assert replay(start).checkpoints["a"].status == "saving"
    done = saved(2, "a", 5, trigger="signal")
    info = replay(done, start).checkpoints["a"]
    assert (info.status, info.started_at, info.trigger) == ("saved", T0 + 1, "signal")
    again = ev(CheckpointStarted, 3, path="a", trigger="manual", step=9)
    fail = ev(CheckpointFailed, 4, path="a", trigger="manual", error="disk full", step=9)
    info = replay(fail, again, done, start).checkpoints["a"]
    assert (info.status, info.step, info.error) == ("saved", 5, "disk full")
    info = replay(ev(CheckpointFailed, 4, path="b", trigger="manual", error="quota")).checkpoints[
        "b"
    ]
    assert (info.status, info.error, info.t) == ("failed", "quota", None)
    gone = ev(CheckpointRemoved, 5, path="a", reason="rotation")
    info = replay(gone, done).checkpoints["a"]
    assert (info.status, info.reason) == ("removed", "rotation")
    assert replay(done, ev(CheckpointInvalid, 5, path="a", reason="size")).checkpoints[
        "a"
    ].status == ("invalid")
    assert replay(gone, done, saved(6, "a", 7)).checkpoints["a"].status == "saved"


def test_valid_checkpoints_are_ordered_by_step_then_time() -> None:
    """valid_checkpoints() lists saved ones by (step, t), whatever order they arrived in."""
    state = replay(saved(3, "c", 20), saved(1, "a", 10), saved(2, "b", 20))
    assert [c.path for c in state.valid_checkpoints()] == ["a", "b", "c"]


# --- commands ----------------------------------------------------------------------------------


def cf(cid: str, location: Any, *, error: str | None = None) -> CommandFile:
    command = None if error else SaveNow(id=cid, t=T0, author="ada", host="login1", expires_at=T0)
    return CommandFile(cid, location, command, error, T0)


def test_command_goes_pending_received_applied() -> None:
    """A command is pending in the inbox, received once claimed, applied when its event says so."""
    state = replay(cf("c1", "inbox"))
    assert state.commands["c1"].status == "pending" and state.commands["c1"].author == "ada"
    state.apply(TailBatch(commands=[cf("c1", "claimed")]))
    assert state.commands["c1"].status == "received"
    received = ev(CommandReceived, 1, command_id="c1", command="save_now")
    applied = ev(CommandApplied, 2, command_id="c1", command="save_now", detail="c/x.ckpt")
    state.apply(TailBatch(events=[received]))
    assert (state.commands["c1"].status, state.commands["c1"].received_at) == ("received", T0 + 1)
    state.apply(TailBatch(events=[applied], commands=[cf("c1", "done")]))
    info = state.commands["c1"]
    assert (info.status, info.detail, info.resolved_at, info.location) == (
        "applied",
        "c/x.ckpt",
        T0 + 2,
        "done",
    )


def test_outcome_before_the_file_still_wins() -> None:
    """An outcome event read before the file was seen in the inbox outranks the file's location."""
    applied = ev(CommandApplied, 2, command_id="c1", command="save_now", detail="ok")
    info = replay(applied, cf("c1", "inbox")).commands["c1"]
    assert (info.status, info.author, info.command) == ("applied", "ada", "save_now")


def test_outcome_without_a_file_creates_the_entry() -> None:
    """An outcome event for a command whose file was never seen still shows the command."""
    info = replay(ev(CommandExpired, 2, command_id="c9", reason="ttl", command="save_now"))
    assert (info.commands["c9"].status, info.commands["c9"].reason) == ("expired", "ttl")


def test_malformed_command_shows_its_error_until_rejected() -> None:
    """A malformed file is 'malformed' with the parse error until command_rejected arrives."""
    state = replay(cf("bad", "inbox", error="bad.json: not a ckptdash command"))
    assert (state.commands["bad"].status, state.commands["bad"].error) == (
        "malformed",
        "bad.json: not a ckptdash command",
    )
    state.apply(TailBatch(events=[ev(CommandReceived, 1, command_id="bad", command="")]))
    assert state.commands["bad"].status == "malformed"
    state.apply(TailBatch(events=[ev(CommandRejected, 2, command_id="bad", reason="malformed")]))
    info = state.commands["bad"]
    assert (info.status, info.reason, info.error) == (
        "rejected",
        "malformed",
        "bad.json: not a ckptdash command",
    )


# --- progress ----------------------------------------------------------------------------------


def test_progress_series_keeps_the_first_point_per_second() -> None:
    """100k rank-0 heartbeats at 10 ms keep one (t, step) per second, the earliest of each."""
    hbs = [ev(Heartbeat, 0.25 + i * 0.01, step=i) for i in range(100_000)]
    other_rank = [ev(Heartbeat, 0.3 + i, rank=1, step=10**6) for i in range(100)]
    state = RunState()
    state.apply_events(hbs + other_rank)
    points = state.series[0]
    assert len(points) == 1001  # T0 + 0.25 … T0 + 1000.24 touches 1001 whole seconds
    assert points[:2] == [(T0 + 0.25, 0), (T0 + 1.0, 75)]
    assert all(step < 10**6 for _, step in points)


def test_progress_series_is_bounded_and_order_free() -> None:
    """Heartbeats over more seconds than SERIES_POINTS coarsen the buckets, in any order alike."""
    hbs = [ev(Heartbeat, i * 0.7, step=i) for i in range(6 * SERIES_POINTS)]
    forward, shuffled = RunState(), RunState()
    forward.apply_events(hbs)
    mixed = hbs[:]
    random.Random(1).shuffle(mixed)
    for i in range(0, len(mixed), 333):
        shuffled.apply_events(mixed[i : i + 333])
    assert SERIES_POINTS // 2 <= len(forward.series[0]) <= SERIES_POINTS
    assert forward.series == shuffled.series
    assert forward.to_dict() == shuffled.to_dict()


def test_progress_prefers_rank_0_and_decodes_metrics() -> None:
    """The latest rank-0 heartbeat gives progress even when another rank's is later."""
    state = replay(
        ev(Heartbeat, 1, step=10, epoch=1, metrics={"loss": 0.5}, time_left_s=60.0),
        ev(Heartbeat, 5, rank=3, step=11, metrics={"loss": 9.0}),
    )
    p = state.progress
    assert p is not None
    assert (p.rank, p.step, p.epoch, p.metrics, p.time_left_s) == (0, 10, 1, {"loss": 0.5}, 60.0)
    state.apply(TailBatch(events=[saved(7, "c", 12)]))
    assert state.progress is not None and (state.progress.step, state.progress.t) == (12, T0 + 7)


def test_heartbeats_at_the_same_time_resolve_the_same_way() -> None:
    """Two heartbeats with equal t pick the same one whichever arrives first."""
    a, b = ev(Heartbeat, 1, step=1), ev(Heartbeat, 1, step=2)
    assert replay(a, b).to_dict() == replay(b, a).to_dict()


# --- attempts, bad lines -----------------------------------------------------------------------


def test_attempt_outcomes() -> None:
    """finished, stopped, failed, running — and lost when a later attempt began without an end."""
    state = replay(
        ev(RunStarted, 0, attempt=0),
        ev(RunStarted, 10, attempt=1),
        ev(RunFinished, 12, attempt=1, reason="requeue"),
        ev(RunStarted, 20, attempt=2),
        ev(RunFailed, 22, attempt=2, error="OOM"),
        ev(RunStarted, 30, attempt=3),
        ev(RunFinished, 32, attempt=3),
        ev(RunStarted, 40, attempt=4),
    )
    assert {n: a.outcome for n, a in state.attempts.items()} == {
        0: "lost",
        1: "stopped",
        2: "failed",
        3: "finished",
        4: "running",
    }
    assert list(state.attempts) == [0, 1, 2, 3, 4]


def test_rank_0_speaks_for_the_attempt() -> None:
    """Rank 0's run_started gives the attempt's host and world size, whichever rank came first."""
    state = replay(
        ev(RunStarted, 0.5, rank=1, world_size=9),
        ev(RunStarted, 1, world_size=2),
        ev(RunResumed, 2, rank=1, path="x", reason="r1"),
        ev(RunResumed, 3, path="y", reason="r0"),
    )
    a = state.attempts[0]
    assert (a.host, a.world_size, a.started_at, a.resumed_from, a.ranks) == (
        "n0",
        2,
        T0 + 1,
        "y",
        [0, 1],
    )


def test_bad_lines_are_counted_with_the_last_samples() -> None:
    """Bad lines count by reason; 20 samples are kept, the last ones by (file, line)."""
    bad = [BadLine("A0000.jsonl", i, "corrupt", "x") for i in range(1, 51)]
    bad.append(BadLine("A0001.jsonl", 1, "unknown_kind", "new"))
    state = RunState()
    state.apply_bad(reversed(bad))
    assert state.bad_lines.counts == {"corrupt": 50, "unknown_kind": 1}
    assert state.bad_lines.samples == bad[-20:]


def test_state_module_imports_only_the_schema() -> None:
    """RunState's module imports the stdlib, msgspec, ckptdash.events and its own parts (the
    records among them) at run time; no Panel, no files."""
    tree = ast.parse(Path(state_module.__file__ or "").read_text())
    imported = set()
    for node in tree.body:  # module level; the TYPE_CHECKING block is an If, not an import
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    ours = {name for name in imported if name.split(".")[0] == "ckptdash"}
    assert ours == {"ckptdash", "ckptdash.events", "ckptdash.state", "ckptdash.state.records"}
    others = {name.split(".")[0] for name in imported} - {"ckptdash", "msgspec", "__future__"}
    assert others <= set(sys.stdlib_module_names), others


def test_state_parts_import_only_the_schema_and_each_other() -> None:
    """The modules RunState is split into (ckptdash/state/*.py) keep the package's rule: the
    stdlib, msgspec, ckptdash.events, the records and each other at run time; no Panel, no
    files. (``reading.py`` is the package's one door to the files: it opens a run, through
    ``snapshot.py`` when the run's snapshot can be trusted; ``runset.py`` holds a folder's runs
    opened through it.)"""
    folder = Path(state_module.__file__ or "").parent
    doors = ("reading.py", "snapshot.py", "runset.py")
    parts = sorted(p for p in folder.glob("[!_]*.py") if p.name not in doors)
    assert len(parts) >= 6, parts
    for part in parts:
        imported = set()
        for node in ast.parse(part.read_text()).body:
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
        ours = {name for name in imported if name.split(".")[0] == "ckptdash"}
        allowed = {"ckptdash", "ckptdash.events", "ckptdash.state.records"}
        ours -= {"ckptdash.state"}  # `from ckptdash.state import series`: a sibling part
        assert all(n in allowed or n.startswith("ckptdash.state.") for n in ours), (part, ours)
        others = {name.split(".")[0] for name in imported} - {"ckptdash", "msgspec", "__future__"}
        assert others <= set(sys.stdlib_module_names), (part, others)


def test_a_loaded_state_keeps_none_of_the_logs_bytes_alive(tmp_path: Path) -> None:
    """A state that read a log holds what it replayed, not the log: the heartbeat it keeps
    per rank owns its metrics instead of pointing into the piece of log it was decoded from
    (a watch over 1,000 runs held every run's last piece, up to a 1 MiB read, that way)."""
    import gc
    import tracemalloc

    from ckptdash._dev.scale_runs import write_run
    from ckptdash.tail import RunTailer

    written = write_run(tmp_path / "run", ranks=1, seconds=6 * 3600, pulses_in_log=True)
    assert written.bytes > 2_000_000
    tracemalloc.start()
    try:
        tailer = RunTailer(tmp_path / "run", read_bytes=16 << 20, decode_bytes=16 << 20)
        state = RunState(str(tmp_path / "run"))
        for batch in tailer.batches():  # one piece: the whole file
            state.apply(batch)
        del tailer, batch
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert state.events_total == written.lines
    assert kept < written.bytes / 2, f"{kept / 1e6:.1f} MB kept for {written.bytes / 1e6:.1f} MB"
