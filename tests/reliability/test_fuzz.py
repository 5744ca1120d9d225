"""Fuzzing the three parsers that read what others wrote: event lines, commands, settings.

Hypothesis generates raw bytes and JSON-shaped near-misses. The CI sample is
about 10,000 inputs in all; ``CKPTDASH_LONG=1`` runs ten times as many. The
properties: nothing raises but the documented error (never a crash), a line or
file is never silently dropped, and every bad command that reaches the training
side is answered ``command_rejected`` with a reason that names the file.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckptdash import control
from ckptdash.errors import MalformedControlFile
from ckptdash.events import (
    COMMANDS,
    KINDS,
    BadLine,
    CommandApplied,
    CommandReceived,
    CommandRejected,
    Event,
    SaveNow,
    Settings,
    decode_command,
    decode_line,
    decode_lines,
    decode_settings,
    encode,
    encode_command,
    encode_settings,
)
from ckptdash.resume import choose_resume
from ckptdash.rundir import TEMP_PREFIX, RunDir
from ckptdash.schedulers.base import Scheduler
from ckptdash.state import RunState
from ckptdash.tail import RunTailer
from ckptdash.train.config import TrainConfig
from ckptdash.train.engine.session import Session
from tests.reliability.conftest import FUZZED, LONG


def examples(n: int) -> Any:
    """Hypothesis settings for ``n`` examples in CI (10× with CKPTDASH_LONG=1)."""
    return settings(
        max_examples=n * 10 if LONG else n,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# --- strategies ----------------------------------------------------------------------------

WEIRD: list[Any] = [
    None, True, False, 0, -1, 2**63, -(2**63) - 1, 2**64, 1e308, -0.0, 0.5, 1e-300,
    "", "x", "periodic", "signal", "save_now", "stop_after_save", "node17", "x" * 300,
    "\u0000", "é\u2028", "../../etc/passwd", [], {}, [1, "a"], {"a": 1},
    {"kind": "heartbeat"}, [[[]]], {"": None},
]  # fmt: skip
"""Values of every JSON type, edge sizes and strings a careless writer might put anywhere."""
EXTRA_NAMES = st.sampled_from(["x", "sudo", "", "kind", "v", "id", "metrics", "é"])


def _field_values() -> st.SearchStrategy[Any]:
    # Mostly plausible values, sometimes wrong types: the shapes a buggy writer produces.
    return st.one_of(
        st.sampled_from(WEIRD),
        st.integers(min_value=-5, max_value=10**12),
        st.floats(allow_nan=False, allow_infinity=False),
    )


_REQUIRED = {
    "t": 1.0, "run": "r", "attempt": 0, "path": "checkpoints/a.ckpt", "reason": "x",
    "error": "e", "trigger": "periodic", "size_bytes": 1, "duration_s": 0.1,
    "signal": "SIGUSR2", "command_id": "c1", "command": "save_now", "error_type": "E",
    "message": "m", "metric": "loss", "value": 1.0,
    "alert": "hung", "since": 1.0, "action": "requeue", "ok": True, "logger": "tensorboard",
}  # fmt: skip


def _valid_event(kind: str) -> dict[str, Any]:
    event = decode_line(msgspec.json.encode({**_REQUIRED, "kind": kind}))
    assert isinstance(event, Event), event
    obj: dict[str, Any] = msgspec.json.decode(encode(event))
    return obj


VALID_EVENTS = {kind: _valid_event(kind) for kind in KINDS}


@st.composite
def event_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """A valid event's JSON object with 0-3 fields changed, removed or added (or its kind)."""
    obj = dict(VALID_EVENTS[draw(st.sampled_from(sorted(VALID_EVENTS)))])
    for _ in range(draw(st.integers(0, 3))):
        name = draw(st.sampled_from(sorted(obj)) | EXTRA_NAMES)
        if draw(st.integers(0, 3)) == 0:
            obj.pop(name, None)
        else:
            obj[name] = draw(_field_values())
    return obj


@st.composite
def lines(draw: st.DrawFn) -> bytes:
    """A log buffer: valid events, near-miss objects and raw garbage, one per line; the
    last line may lack its newline (a write in progress, or torn by a crash)."""
    out = []
    for _ in range(draw(st.integers(0, 4))):
        if draw(st.integers(0, 3)) == 0:
            out.append(draw(st.binary(max_size=80)).replace(b"\n", b" "))
        else:
            out.append(msgspec.json.encode(draw(event_dicts())))
    end = b"\n" if draw(st.booleans()) else b""
    return b"\n".join(out) + end


@st.composite
def command_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """A JSON object shaped like a command, with some fields wrong, missing or extra."""
    obj: dict[str, Any] = {
        "command": draw(st.sampled_from([*COMMANDS, "format_disk", ""])),
        "v": 1,
        "id": draw(st.from_regex(r"[A-Za-z0-9_.-]{1,64}", fullmatch=True) | st.text(max_size=70)),
        "t": 1.0,
        "author": "ana",
        "host": "login1",
        "expires_at": None,
    }
    for name in draw(st.lists(st.sampled_from(sorted(obj)), max_size=3)):
        if draw(st.booleans()):
            obj.pop(name, None)
        else:
            obj[name] = draw(_field_values())
    if draw(st.integers(0, 4)) == 0:
        obj[draw(EXTRA_NAMES)] = draw(_field_values())
    return obj


@st.composite
def settings_dicts(draw: st.DrawFn) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "v": 1,
        "requeue_suspended": False,
        "resume_pin": None,
        "updated_at": 0.0,
        "updated_by": "",
    }
    for name in draw(st.lists(st.sampled_from(sorted(obj)), max_size=3)):
        if draw(st.booleans()):
            obj.pop(name, None)
        else:
            obj[name] = draw(_field_values())
    if draw(st.integers(0, 4)) == 0:
        obj[draw(EXTRA_NAMES)] = draw(_field_values())
    return obj


def json_or_bytes(shaped: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    """Mostly the object encoded whole; sometimes cut short (a writer killed mid-file)."""
    return st.tuples(shaped.map(msgspec.json.encode), st.integers(0, 9)).map(
        lambda pair: pair[0] if pair[1] else pair[0][: len(pair[0]) // 2]
    )


# --- event lines -----------------------------------------------------------------------------


def _records_per_line(buf: bytes) -> int:
    return sum(1 for line in buf.split(b"\n") if line.strip())


@examples(2000)
@given(st.binary(max_size=400))
def test_decode_lines_of_random_bytes(buf: bytes) -> None:
    """Random bytes as a log: see :func:`check_decode_lines`."""
    check_decode_lines(buf)


@examples(1200)
@given(lines())
def test_decode_lines_of_near_miss_events(buf: bytes) -> None:
    """Valid events with fields changed, removed or added, and garbage lines: see
    :func:`check_decode_lines`."""
    check_decode_lines(buf)


def check_decode_lines(buf: bytes) -> None:
    """``decode_lines`` returns one Event or BadLine per non-blank line, never raises,
    and what it returns replays into a RunState without error."""
    FUZZED["decode_lines"] += 1
    records = decode_lines(buf, file="f")
    assert all(isinstance(r, (Event, BadLine)) for r in records)
    assert len(records) == _records_per_line(buf)
    state = RunState()
    state.apply_events(r for r in records if isinstance(r, Event))
    state.apply_bad(r for r in records if isinstance(r, BadLine))
    msgspec.json.encode(state.to_dict())


@examples(300)
@given(
    lines(),
    st.lists(st.integers(1, 64), min_size=1, max_size=8),
    st.integers(1, 97),
    st.integers(1, 131),
)
def test_tailing_in_pieces_reads_only_whole_lines(
    tmp_path_factory: pytest.TempPathFactory,
    buf: bytes,
    cuts: list[int],
    read_bytes: int,
    decode_bytes: int,
) -> None:
    """A log written in arbitrary pieces and polled after each, with tiny read and decode
    sizes: the tailer never parses a line before its newline, never raises, and ends with
    exactly what one ``decode_lines`` of the complete lines gives."""
    FUZZED["RunTailer (pieces)"] += 1
    run = RunDir(tmp_path_factory.mktemp("tail"))
    run.events.mkdir()
    run.run_file.write_bytes(b'{"v":1,"run_id":"r","created_at":0}')  # the samples' run id
    path = run.events / "A0000.R0000.h.1.jsonl"
    tailer = RunTailer(run, read_bytes=read_bytes, decode_bytes=decode_bytes)
    got: list[Event | BadLine] = []
    with open(path, "ab") as f:
        pos = 0
        for cut in [*cuts, len(buf)]:
            f.write(buf[pos : pos + cut])
            f.flush()
            pos += cut
            batch = tailer.poll()
            got += [*batch.events, *batch.bad]
            whole = buf[: buf.rfind(b"\n", 0, min(pos, len(buf))) + 1]
            assert sum(1 for _ in got) == _records_per_line(whole)
    complete = buf[: buf.rfind(b"\n") + 1]
    want = _vouched(decode_lines(complete, file=path.name), complete)
    key = lambda r: (0, encode(r)) if isinstance(r, Event) else (1, r.line, r.reason)  # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, want))
    assert tailer.pending_bytes.get(path.name, 0) == len(buf) - len(complete)


def _vouched(records: list[Event | BadLine], complete: bytes) -> list[Event | BadLine]:
    """What a reader keeps of ``records`` (from a file named for attempt 0, rank 0 of run
    "r"): a checkpoint record counts only when it and the file's first line carry those."""
    numbered = [i + 1 for i, line in enumerate(complete.split(b"\n")) if line.strip()]
    first = records[0] if records else None

    def ours(r: Event | BadLine | None) -> bool:
        return isinstance(r, Event) and (r.run, r.attempt, r.rank) == ("r", 0, 0)

    out: list[Event | BadLine] = []
    for lineno, r in zip(numbered, records, strict=True):
        vouched = type(r).__name__.startswith(("Checkpoint", "RunResumed"))
        if isinstance(r, Event) and vouched and not (ours(r) and ours(first)):
            out.append(BadLine("", lineno, "invalid", ""))
            continue
        out.append(r)
    return out


# --- commands --------------------------------------------------------------------------------


@examples(2000)
@given(st.binary(max_size=300))
def test_decode_command_of_random_bytes(data: bytes) -> None:
    """Random bytes as a command file: see :func:`check_decode_command`."""
    check_decode_command(data)


@examples(1000)
@given(json_or_bytes(command_dicts()))
def test_decode_command_of_near_miss_commands(data: bytes) -> None:
    """Command objects with fields wrong, missing or extra, whole or cut short: see
    :func:`check_decode_command`."""
    check_decode_command(data)


def check_decode_command(data: bytes) -> None:
    """A Command that re-encodes to itself, or MalformedControlFile naming the file and
    how to issue commands — nothing else."""
    FUZZED["decode_command"] += 1
    try:
        cmd = decode_command(data, "inbox/x.json")
    except MalformedControlFile as exc:
        error = str(exc)
    else:
        error = ""
    if error:
        assert "inbox/x.json" in error and "ckptdash save" in error
        return
    assert decode_command(encode_command(cmd), "x") == cmd
    assert cmd.author is not None and cmd.host is not None


_NAMES = st.one_of(
    st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True).map(lambda s: s + ".json"),
    st.from_regex(r"[A-Za-z0-9 _.%-]{1,30}", fullmatch=True).filter(
        lambda s: s not in (".", "..") and not s.startswith((".nfs", TEMP_PREFIX))
    ),
)
_COMMAND_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}\.json$")  # what the job claims
_KINDS = st.sampled_from(["file", "file", "file", "file", "symlink", "directory", "fifo", "big"])


def test_every_bad_command_is_claimed_and_rejected_with_a_reason(
    fast_dir: Path, figures: Callable[[str, str], None]
) -> None:
    """Files of any content, name and type dropped into a running job's inbox: the job
    claims each regular file named ``<id>.json`` (none is dropped or left pending), answers
    every one it cannot parse with ``command_rejected`` whose reason names the file, applies
    the valid ones once, and moves each to ``control/done/``. Every other name, and every
    link, folder or FIFO, is never claimed, answered or moved (issue 22)."""
    tmp_path = fast_dir
    run = tmp_path / "run"
    config = TrainConfig(
        run_dir=run, poll_interval_s=1e-9, agree_interval_s=1e-9, heartbeat_interval_s=1e9
    )
    session = Session(config, scheduler=Scheduler({}), rank=0, world_size=1)
    session.start(install_signals=False)
    rd = RunDir(run)
    tailer = RunTailer(rd)
    tailer.poll()
    counts: Counter[str] = Counter()
    state = {"step": 0, "n": 0}

    @examples(600)
    @given(json_or_bytes(command_dicts()), _NAMES, _KINDS, st.integers(0, 5))
    def one(data: bytes, name: str, kind: str, roll: int) -> None:
        FUZZED["claim + Session answer"] += 1
        state["n"] += 1
        name = f"{state['n']:06d}{name}"  # unique across examples
        if roll == 0:  # a well-formed command now and then, named after its id
            # Issued now: a command more than a day old expires (control.MAX_TTL_S).
            cmd = SaveNow(id=f"{state['n']:06d}ok", t=time.time(), author="ana", host="login1")
            data, name, kind = encode_command(cmd), f"{cmd.id}.json", "file"
        path = rd.inbox / name
        if kind == "symlink":
            target = tmp_path / f"target-{name}"
            target.write_bytes(data)
            path.symlink_to(target)
        elif kind == "directory":
            path.mkdir()
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "big":
            path.write_bytes(data + b" " * (control.MAX_CONTROL_FILE_BYTES + 1))
        else:
            path.write_bytes(data)
        claimable = kind in ("file", "big") and _COMMAND_NAME.match(name)
        cid = control.safe_name(name.removesuffix(".json") or name)
        events: list[object] = []
        # The job scans its inbox in short slices: on a busy machine a file may take a few
        # step boundaries to be reached; one that must be left alone gets a few too.
        for _ in range(200 if claimable else 3):
            state["step"] += 1
            decision = session.boundary(state["step"])
            if decision is not None:
                session.after_save(None, str(run / "checkpoints" / "x.ckpt"))
            events += tailer.poll().events
            if claimable and any(
                isinstance(e, (CommandApplied, CommandRejected)) and e.command_id == cid
                for e in events
            ):
                break
        received = [e for e in events if isinstance(e, CommandReceived) and e.command_id == cid]
        outcomes = [
            e
            for e in events
            if isinstance(e, (CommandApplied, CommandRejected)) and e.command_id == cid
        ]
        if kind not in ("file", "big") or not _COMMAND_NAME.match(name):
            assert received == outcomes == [] and os.path.lexists(path), (name, kind)
            counts["left alone"] += 1
            shutil.rmtree(path) if kind == "directory" else path.unlink()
            return
        assert len(received) == 1 and len(outcomes) == 1, (name, kind, data[:80], events)
        out = outcomes[0]
        if isinstance(out, CommandRejected):
            counts["rejected"] += 1
            assert out.reason and control.safe_name(name) in out.reason
        else:
            counts["applied"] += 1
            assert kind == "file" and roll == 0
        assert os.path.lexists(rd.done / name) and not os.listdir(rd.inbox)

    one()
    session.close()
    figures(
        "fuzz: bad commands",
        f"{sum(counts.values())} fuzzed files in a running job's inbox:"
        f" {counts['rejected']} rejected with a reason naming the file, {counts['applied']}"
        f" valid ones applied once, {counts['left alone']} links, folders, FIFOs and other"
        " names never claimed, 0 dropped",
    )
    assert min(counts["rejected"], counts["applied"], counts["left alone"]) > 0, counts


# --- settings ----------------------------------------------------------------------------------


@examples(2000)
@given(st.binary(max_size=300))
def test_decode_settings_of_random_bytes(data: bytes) -> None:
    """Random bytes as the settings file: see :func:`check_decode_settings`."""
    check_decode_settings(data)


@examples(800)
@given(json_or_bytes(settings_dicts()))
def test_decode_settings_of_near_miss_settings(data: bytes) -> None:
    """Settings objects with fields wrong, missing or extra, whole or cut short: see
    :func:`check_decode_settings`."""
    check_decode_settings(data)


def check_decode_settings(data: bytes) -> None:
    """Settings that re-encode to themselves, or MalformedControlFile naming the file and
    the fix — nothing else."""
    FUZZED["decode_settings"] += 1
    try:
        value = decode_settings(data, "control/settings.json")
    except MalformedControlFile as exc:
        error = str(exc)
    else:
        error = ""
    if error:
        assert "control/settings.json" in error and "fix" in error
        return
    assert isinstance(value, Settings)
    assert decode_settings(encode_settings(value), "x") == value


def test_a_bad_settings_file_never_stops_the_resume_rule(tmp_path: Path) -> None:
    """Whatever the settings file holds, ``choose_resume`` answers (a pin is used only if it
    names a recorded checkpoint; an unreadable file is reported as a skip, never raised) and
    ``update_settings`` refuses to overwrite a file it cannot read."""
    run = RunDir(tmp_path / "run")
    run.ensure()

    @examples(500)
    @given(json_or_bytes(settings_dicts()))
    def one(data: bytes) -> None:
        FUZZED["settings file → resume rule"] += 1
        run.settings.write_bytes(data)
        choice = choose_resume(run)
        assert choice.path is None
        try:
            decode_settings(data, "s")
        except MalformedControlFile:
            assert any("settings unreadable" in why for _, why in choice.skipped)
            with pytest.raises(MalformedControlFile):
                control.update_settings(run, requeue_suspended=True)
            assert run.settings.read_bytes() == data

    one()
