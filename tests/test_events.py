"""The event schema: strict on write, lenient on read."""

from __future__ import annotations

import msgspec
import pytest

from ckptdash import events
from ckptdash.errors import EventValidationError, MalformedControlFile

ENVELOPE = {"t": 1_700_000_000.5, "run": "r1", "attempt": 2, "rank": 1, "host": "n1", "step": 7}

# The smallest valid set of kind-specific fields for every kind; a new kind must be added here.
REQUIRED: dict[str, dict[str, object]] = {
    "run_started": {},
    "run_resumed": {"path": "c/a.ckpt", "reason": "newest valid"},
    "run_finished": {},
    "run_failed": {"error": "boom"},
    "heartbeat": {"epoch": 1, "metrics": events.encode_metrics({"loss": 0.25})},
    "checkpoint_started": {"path": "c/a.ckpt", "trigger": "periodic"},
    "checkpoint_saved": {
        "path": "c/a.ckpt",
        "trigger": "signal",
        "size_bytes": 10,
        "duration_s": 0.5,
        "checksum": "xxh3_128:00",
    },
    "checkpoint_failed": {"path": "c/a.ckpt", "trigger": "manual", "error": "disk full"},
    "checkpoint_removed": {"path": "c/a.ckpt", "reason": "rotation"},
    "checkpoint_invalid": {"path": "c/a.ckpt", "reason": "size 3 != 10"},
    "checkpoint_dir_declared": {"path": "/scratch/ckpt"},
    "control_failed": {"reason": "done/ is not writable", "command_id": "c1"},
    "signal_received": {"signal": "SIGUSR2", "action": "requeue"},
    "requeue_issued": {"job_id": "12", "command": "scontrol requeue 12"},
    "requeue_skipped": {"reason": "suspended"},
    "command_received": {"command_id": "c1", "command": "save_now"},
    "command_applied": {"command_id": "c1", "command": "save_now", "detail": "c/a.ckpt"},
    "command_rejected": {"command_id": "c1", "reason": "malformed"},
    "command_expired": {"command_id": "c1", "reason": "ttl"},
    "exception": {"error_type": "ValueError", "message": "bad"},
    "anomaly": {"metric": "loss", "value": None},
    "logger_attached": {"logger": "wandb", "id": "ckptdash-3f2a91c0d4e1", "redone": "dropped"},
    "pulse": {},
    "alert_raised": {"alert": "hung", "since": 1_700_000_000.0},
    "alert_cleared": {"alert": "hung"},
    "action_taken": {
        "alert": "hung",
        "action": "requeue",
        "command": "scontrol requeue 1",
        "ok": True,
    },
}


def make(kind: str, **overrides: object) -> events.Event:
    fields = {**ENVELOPE, **REQUIRED[kind], **overrides}
    return events.KINDS[kind](**fields)  # type: ignore[arg-type]


def test_every_kind_has_a_sample() -> None:
    """The samples above cover every kind the schema defines (so round trips cover them all)."""
    assert set(REQUIRED) == set(events.KINDS)


@pytest.mark.parametrize("kind", sorted(events.KINDS))
def test_round_trip_every_kind(kind: str) -> None:
    """Each kind encodes to one JSON line with v=1 and decodes back to an equal event."""
    event = make(kind)
    line = events.encode(event)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    raw = msgspec.json.decode(line)
    assert raw["kind"] == kind and raw["v"] == events.FORMAT_VERSION
    (back,) = events.decode_lines(line)
    assert back == event


def test_triggers_are_the_documented_six() -> None:
    """The trigger vocabulary is exactly the one the format spec names."""
    assert set(events.TRIGGERS) == {"periodic", "manual", "signal", "exception", "api", "final"}


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        ("checkpoint_saved", "trigger", "whenever"),
        ("checkpoint_saved", "size_bytes", -1),
        ("checkpoint_saved", "step", "seven"),
        ("heartbeat", "attempt", -3),
        ("run_started", "run", ""),
        ("signal_received", "signal", 15),
    ],
)
def test_invalid_event_raises_naming_field_and_value(kind: str, field: str, value: object) -> None:
    """Writing an invalid event raises, and the message names the field and the bad value."""
    event = make(kind, **{field: value})
    with pytest.raises(EventValidationError) as info:
        events.encode(event)
    assert field in str(info.value)
    assert repr(value) in str(info.value)


def test_metrics_must_be_numbers() -> None:
    """A non-numeric metric is refused with its name and value, and how to fix it."""
    with pytest.raises(EventValidationError, match=r"'loss' = 'low'.*float"):
        events.encode_metrics({"loss": "low"})
    assert events.decode_metrics(events.encode_metrics({"a": 1, "b": 2.5})) == {"a": 1, "b": 2.5}


def test_reader_counts_bad_lines_and_keeps_the_good_ones() -> None:
    """Corrupt lines, unknown kinds and invalid fields come back as BadLine; others decode."""
    good = events.encode(make("run_finished"))
    buf = (
        good
        + b"{not json\n"
        + b'{"kind":"from_the_future","v":2,"t":1,"run":"r","attempt":0}\n'
        + b'{"kind":"checkpoint_saved","t":1,"run":"r","attempt":0}\n'
        + good
    )
    out = events.decode_lines(buf, file="A.jsonl")
    assert [type(x).__name__ for x in out] == [
        "RunFinished",
        "BadLine",
        "BadLine",
        "BadLine",
        "RunFinished",
    ]
    bad = [x for x in out if isinstance(x, events.BadLine)]
    assert [(b.line, b.reason) for b in bad] == [
        (2, "corrupt"),
        (3, "unknown_kind"),
        (4, "invalid"),
    ]
    assert all(b.file == "A.jsonl" for b in bad)


def test_extra_fields_are_tolerated_on_read() -> None:
    """A newer writer's extra field does not stop an older reader from reading the event."""
    data = msgspec.json.decode(events.encode(make("checkpoint_saved")))
    data["shard_count"] = 8
    (event,) = events.decode_lines(msgspec.json.encode(data) + b"\n")
    assert isinstance(event, events.CheckpointSaved) and event.size_bytes == 10


def test_command_and_settings_files_round_trip_and_fail_clearly() -> None:
    """Commands and settings encode/decode; malformed ones raise naming the file and the fix."""
    cmd = events.SaveNow(id="c-1", t=1.0, author="ana", host="login1", expires_at=60.0)
    assert events.decode_command(events.encode_command(cmd), "inbox/c-1.json") == cmd
    with pytest.raises(MalformedControlFile, match=r"inbox/x.json.*save_now"):
        events.decode_command(b'{"command":"format_disk"}', "inbox/x.json")
    settings = events.Settings(requeue_suspended=True, resume_pin="checkpoints/a.ckpt")
    assert events.decode_settings(events.encode_settings(settings), "s.json") == settings
    with pytest.raises(MalformedControlFile, match=r"s.json.*ckptdash requeue"):
        events.decode_settings(b'{"requeue_suspended":"yes"}', "s.json")


def test_to_builtins_gives_plain_json_values() -> None:
    """to_builtins turns raw metrics into a plain dict (for status --json)."""
    out = events.to_builtins(make("heartbeat"))
    assert out["metrics"] == {"loss": 0.25} and out["kind"] == "heartbeat"


def test_kind_groups_cover_every_checkpoint_and_command_kind() -> None:
    """The groups of kinds that several readers share name every ``checkpoint_*`` and
    ``command_*`` kind of the schema exactly once, so a kind added later joins its group."""
    assert set(events.CHECKPOINT_KINDS) == {k for k in events.KINDS if k.startswith("checkpoint_")}
    assert set(events.COMMAND_KINDS) == {k for k in events.KINDS if k.startswith("command_")}
    assert set(events.COMMAND_OUTCOME_KINDS) == set(events.COMMAND_KINDS) - {"command_received"}
    for kinds in (events.CHECKPOINT_KINDS, events.COMMAND_KINDS, events.COMMAND_OUTCOME_KINDS):
        assert len(set(kinds)) == len(kinds)
    assert [c.KIND for c in events.CHECKPOINT_EVENTS] == list(events.CHECKPOINT_KINDS)
