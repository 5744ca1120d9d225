"""A run written by an attacker who controls every string of every event it records.

Every payload sets ``window.__pwned`` if it ever runs as script, and carries ``MARK`` so a test
can find the text the page shows. Folder names cannot hold ``/``, so the folder payload is the
one HTML trick without a slash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from ckptdash import control
from ckptdash import events as ev
from ckptdash.rundir.writer import EventWriter

MARK: Final = "PWN"
PAYLOADS: Final = (
    f"{MARK}1</script><script>window.__pwned=1</script>",
    f'{MARK}2<img src=x onerror="window.__pwned=2">',
    f"{MARK}3[click](javascript:window.__pwned=3) <a href=javascript:window.__pwned=3>a</a>",
    f"{MARK}4<svg onload=window.__pwned=4>--><!--<script>",
    f"{MARK}5\u2028\u2029'\"`${{window.__pwned=5}}",
)
FOLDER_PAYLOAD: Final = f'{MARK}6<img src=x onerror="window.__pwned=6">'


def payload(n: int) -> str:
    """The n-th payload (cycling), so that each field gets a different trick."""
    return PAYLOADS[n % len(PAYLOADS)]


def write_hostile_run(parent: Path) -> Path:
    """A run folder (named by a payload) with every event kind, every string field a payload,
    a pending command, and settings whose author is a payload. Returns the run directory."""
    root = parent / FOLDER_PAYLOAD
    counter = iter(range(10_000))

    def p() -> str:
        return payload(next(counter))

    with EventWriter(root, attempt=0, host=p()) as w:
        ckpt = str(root / "checkpoints" / "c.ckpt")

        def emit(kind: type[ev.Event], **fields: Any) -> None:
            w.emit(kind, **fields)

        emit(ev.RunStarted, step=0, scheduler=p(), job_id=p(), max_steps=100, requeue_budget=3)
        emit(ev.Heartbeat, step=5, epoch=0, metrics={p(): 1.0, "loss": 0.5})
        emit(ev.CheckpointStarted, step=10, path=p(), trigger="periodic")
        emit(
            ev.CheckpointSaved,
            step=10,
            path=ckpt + p(),
            trigger="periodic",
            size_bytes=9,
            duration_s=0.1,
            checksum=p(),
        )
        emit(ev.CheckpointFailed, step=11, path=p(), trigger="manual", error=p())
        emit(ev.CheckpointRemoved, step=11, path=p(), reason=p())
        emit(ev.CheckpointInvalid, step=11, path=p(), reason=p())
        emit(ev.CheckpointDirDeclared, step=11, path=p())
        emit(ev.SignalReceived, step=12, signal=p(), action=p())
        emit(ev.RequeueIssued, step=12, job_id=p(), command=p())
        emit(ev.RequeueSkipped, step=12, reason=p())
        for cid in ("c1", "c2", "c3", "c4"):
            emit(ev.CommandReceived, step=12, command_id=cid, command=p())
        emit(ev.CommandApplied, step=12, command_id="c1", command=p(), detail=p())
        emit(ev.CommandRejected, step=12, command_id="c2", command=p(), reason=p())
        emit(ev.CommandExpired, step=12, command_id="c3", command=p(), reason=p())
        emit(ev.ControlFailed, step=12, reason=p(), command_id=p())
        emit(ev.ExceptionRaised, step=13, error_type=p(), message=p(), traceback=p())
        emit(ev.RunFailed, step=13, error=p())
    with EventWriter(root, attempt=1, host=p()) as w:
        w.emit(ev.RunStarted, step=13, scheduler="slurm", job_id=p())
        w.emit(ev.RunResumed, step=13, path=p(), reason=p())
        w.emit(ev.Heartbeat, step=20, epoch=1)
        w.emit(ev.RunFinished, step=20, reason=p())
    control.issue(root, "save_now", author=p(), host=p())
    control.update_settings(root, requeue_suspended=True, resume_pin=p(), author=p())
    return root
