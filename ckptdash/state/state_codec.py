"""A :class:`~ckptdash.state.RunState` as JSON-ready builtins and back, exactly: the body of a
snapshot (:mod:`ckptdash.state.snapshot`).

Everything the state would need to go on replaying is kept -- per (attempt, rank) streams, the
thinned series with their metrics, each checkpoint path's events, the commands' answers, the
incident lists, the bad-line counts and samples -- so that a state restored from it and fed
the rest of the log ends where a full replay ends. What is derived from it (the public
``attempts``, ``checkpoints``, ``commands``, ``progress``, the bad-line samples) is derived
again on restore, with the reader's own confinement. Command-file sightings are left out: a
reader lists ``control/`` afresh anyway, and sees only the files there now, as a replay does;
so are the pulse records (``pulses/``), which it reads afresh too: what they add to the state
is the same whether read once or again (the latest time and step of each rank).

The encoding is tagged so that nothing is lost between Python and JSON: a JSON list is always
``[tag, ...]`` -- ``L`` list, ``T`` tuple, ``D`` dict (keys and values alternating), ``B``
bytes (base64), ``W`` raw JSON text (a heartbeat's metrics), ``F`` a float JSON cannot hold
(``inf``, ``-inf``, ``nan``), ``E`` an event (its JSON line, decoded by the event schema),
``O`` one of the state's own classes, ``R`` one of its records. Only the classes named here are
ever built; anything else fails the restore, which the caller answers with a full replay.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import math
from pathlib import Path
from typing import Any, Final, cast

import msgspec

from ckptdash import events as ev_
from ckptdash.events import BadLine, Event
from ckptdash.state import RunState
from ckptdash.state import checkpoints as ckpt_
from ckptdash.state import commands as cmd_
from ckptdash.state import incidents as inc_
from ckptdash.state import metric_points as state_metric_points
from ckptdash.state import records as rec_
from ckptdash.state import series as series_
from ckptdash.state import streams as streams_

_SLOTTED: Final[dict[str, type]] = {
    c.__name__: c for c in (streams_.Stream, streams_.Attempt, series_.Series, ckpt_.Checkpoint)
}
_SLOTTED["Command"] = cmd_.Command
_RECORDS: Final[dict[str, type]] = {
    c.__name__: c
    for c in (
        rec_.AttemptInfo,
        rec_.CheckpointInfo,
        rec_.SavedVersion,
        rec_.SignalInfo,
        rec_.RequeueInfo,
        rec_.ExceptionInfo,
        rec_.CommandInfo,
        rec_.Progress,
        rec_.AnomalyInfo,
        rec_.LoggerInfo,
        rec_.AlertRecord,
        BadLine,
    )
}
_FIELDS: Final = {n: tuple(f.name for f in dataclasses.fields(c)) for n, c in _RECORDS.items()}
_SLOTS: Final = {n: tuple(c.__slots__) for n, c in _SLOTTED.items()}  # type: ignore[attr-defined]

_DERIVED: Final = frozenset(
    {
        "root",
        "run_id",
        "_run_id_given",
        "_roots",
        "attempts",
        "checkpoints",
        "commands",
        "progress",
        "bad_lines",
        "metric_decoder",
        "_touched",
        "_dirty_checkpoints",
        "_dirty_commands",
        "_progress_dirty",
        "_lists_dirty",
        "record_pulses",  # the reader reads every pulse record afresh, as a replay does
    }
)
"""RunState attributes not stored: the reader's own, or derived again on restore."""
_KEPT: Final = tuple(sorted(set(vars(RunState())) - _DERIVED))
"""RunState attributes stored, and the bad-line counts (``bad_counts``)."""

_REASONS: Final = frozenset({"corrupt", "unknown_kind", "invalid", "oversize"})
_FLOATS: Final = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan}
_event_json = msgspec.json.Encoder().encode


def fingerprint() -> str:
    """What a body depends on besides its data: the code that replays a log into a state (the
    events, the tailer, the state; their source hashed) and the shape of each class kept. A
    snapshot another version of that code wrote is not restored; "" where the source cannot be
    read (then no snapshot is written or read)."""
    global _fingerprint
    if _fingerprint is None:
        package = Path(__file__).resolve().parent.parent
        digest = hashlib.sha256(repr((_SLOTS, _FIELDS, _KEPT)).encode())
        try:
            for folder in ("events", "tail", "state"):
                for source in sorted((package / folder).glob("*.py")):
                    digest.update(source.name.encode() + b"\0" + source.read_bytes())
            _fingerprint = digest.hexdigest()[:32]
        except OSError:
            _fingerprint = ""
    return _fingerprint


_fingerprint: str | None = None


# --- encoding ----------------------------------------------------------------------------------


def _enc(x: Any) -> Any:
    t = type(x)
    if x is None or t is str or t is int or t is bool:
        return x
    if t is float:
        return x if math.isfinite(x) else ["F", repr(x)]
    if t is tuple:
        return ["T", *map(_enc, x)]
    if t is list:
        return ["L", *map(_enc, x)]
    if t is dict:
        out: list[Any] = ["D"]
        for k, v in x.items():
            out.append(_enc(k))
            out.append(_enc(v))
        return out
    if t is bytes:
        return ["B", base64.b64encode(x).decode()]
    if t is msgspec.Raw:
        return ["W", bytes(x).decode()]
    if isinstance(x, Event):
        return ["E", _event_json(x).decode()]
    name = t.__name__
    if _SLOTTED.get(name) is t:
        return ["O", name, *(_enc(getattr(x, s)) for s in _SLOTS[name])]
    if _RECORDS.get(name) is t:
        return ["R", name, *(_enc(getattr(x, f)) for f in _FIELDS[name])]
    raise ValueError(f"a {name} in the state has no snapshot encoding")


def dump_state(state: RunState) -> dict[str, Any]:
    """The state's body: every attribute a replay would go on from (see the module docstring)."""
    commands = {}
    for cid, c in state._commands.items():
        if c.received is None and c.outcome is None:
            continue  # known only from its file: the reader sees the file again, or not
        kept = cmd_.Command()
        kept.received, kept.outcome = c.received, c.outcome
        commands[cid] = kept
    body = {name: _enc(getattr(state, name)) for name in _KEPT if name != "_commands"}
    body["_commands"] = _enc(commands)
    body["bad_counts"] = _enc(dict(state.bad_lines.counts))
    return body


# --- decoding ----------------------------------------------------------------------------------


def _dec(x: Any) -> Any:
    t = type(x)
    if t is not list:
        if x is None or t is str or t is int or t is bool or t is float:
            return x
        raise ValueError(f"unexpected {t.__name__} in the body")
    if not x or type(x[0]) is not str:
        raise ValueError("an untagged list in the body")
    tag = x[0]
    if tag == "L":
        return [_dec(v) for v in x[1:]]
    if tag == "T":
        return tuple(_dec(v) for v in x[1:])
    if tag == "D":
        if len(x) % 2 != 1:
            raise ValueError("a dict with a key and no value")
        return {_dec(x[i]): _dec(x[i + 1]) for i in range(1, len(x), 2)}
    if len(x) < 2 or (tag != "O" and tag != "R" and len(x) != 2) or type(x[1]) is not str:
        raise ValueError(f"a malformed {tag!r} item")
    if tag == "F":
        if x[1] not in _FLOATS:
            raise ValueError(f"not a float: {x[1]!r}")
        return _FLOATS[x[1]]
    if tag == "B":
        return base64.b64decode(x[1], validate=True)
    if tag == "W":
        return msgspec.Raw(x[1].encode())
    if tag == "E":
        ev = ev_.decode_line(x[1].encode())
        if isinstance(ev, BadLine):
            raise ValueError(f"an event that does not decode: {ev.detail}")
        if isinstance(ev, ev_.Heartbeat):
            ev = msgspec.structs.replace(ev, metrics=ev.metrics.copy())
        return ev
    if tag == "O":
        cls = _SLOTTED.get(x[1])
        names = _SLOTS.get(x[1], ())
        if cls is None or len(x) != 2 + len(names):
            raise ValueError(f"not a state class: {x[1]!r}")
        obj: Any = object.__new__(cls)
        for name, value in zip(names, x[2:], strict=True):
            setattr(obj, name, _dec(value))
        return obj
    if tag == "R":
        cls = _RECORDS.get(x[1])
        fields = _FIELDS.get(x[1], ())
        if cls is None or len(x) != 2 + len(fields):
            raise ValueError(f"not a state record: {x[1]!r}")
        return cls(**{f: _dec(v) for f, v in zip(fields, x[2:], strict=True)})
    raise ValueError(f"unknown tag {tag!r}")


def restore_state(body: Any, root: str, run_id: str) -> RunState:
    """A state confined to ``root`` with ``run_id``, as :func:`dump_state` saw it.

    Raises ``ValueError`` (or any error a hostile body provokes: the caller treats every
    exception as "replay instead") when the body is not one this version wrote."""
    if type(body) is not dict or set(body) != {*_KEPT, "bad_counts"}:
        raise ValueError("the body does not hold this version's state attributes")
    state = RunState(root, run_id, confine=True)
    values = {name: _dec(body[name]) for name in _KEPT}
    for name, value in values.items():
        default = getattr(state, name)
        if type(value) is not type(default) and default is not None:
            raise ValueError(f"{name} is a {type(value).__name__}, not a {type(default).__name__}")
        setattr(state, name, value)
    counts = _dec(body["bad_counts"])
    for table in (counts, state.event_counts):
        if type(table) is not dict or any(
            type(k) is not str or type(v) is not int for k, v in table.items()
        ):
            raise ValueError("a count table that is not one")
    if any(type(d) is not str for d in state.checkpoint_dirs):
        raise ValueError("a checkpoint folder that is not a path")
    _check_shapes(state)
    state.bad_lines.counts = counts
    state.bad_lines.samples = [
        BadLine(f, line, cast("inc_._Reason", reason), detail)
        for f, line, reason, detail in sorted(state._bad_heap)
    ]
    state.attempts = {n: state._attempts[n].info for n in sorted(state._attempts)}
    for a in state._attempts.values():
        for rank, s in a.streams.items():
            s.series = a.series if rank == 0 else None  # rank 0's stream feeds the series
    state._dirty_checkpoints = set(state._checkpoints)
    state._dirty_commands = set(state._commands)
    state._progress_dirty = True
    state._finish()
    # Everything a reader asks of a state, once: a body wrong inside fails here, not later.
    state.to_dict(), state.attempt_times(), state.save_outcomes()
    # The metrics too, with a decoder of its own: the state keeps none of them decoded (a
    # follower of a folder holds many runs and shows one; a view decodes them when it shows it).
    state_metric_points.MetricDecoder().decode(state.metric_heartbeats())
    return state


def _check_shapes(state: RunState) -> None:
    """The containers hold what the state's code expects of them (a hostile body may say
    anything); every value inside comes from the classes above, or is a plain scalar."""
    for n, a in state._attempts.items():
        if type(n) is not int or type(a) is not streams_.Attempt or a.info.attempt != n:
            raise ValueError("an attempt that is not one")
        for rank, s in a.streams.items():
            if type(rank) is not int or type(s) is not streams_.Stream:
                raise ValueError("a rank stream that is not one")
    for path, c in state._checkpoints.items():
        if type(path) is not str or type(c) is not ckpt_.Checkpoint or not c.latest:
            raise ValueError("a checkpoint that is not one")
    for cid, cmd in state._commands.items():
        if type(cid) is not str or type(cmd) is not cmd_.Command:
            raise ValueError("a command that is not one")
        if cmd.received is None and cmd.outcome is None:
            raise ValueError("a command with nothing known of it")
    for item in state._bad_heap:
        if type(item) is not tuple or len(item) != 4 or item[2] not in _REASONS:
            raise ValueError("a bad-line sample that is not one")
