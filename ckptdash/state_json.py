"""The JSON view of a :class:`~ckptdash.state.RunState` (``ckptdash status --json``)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptdash.state import RunState


def to_dict(state: RunState) -> dict[str, Any]:
    """The whole state as JSON-ready builtins, in a stable order."""
    return {
        "root": state.root,
        "run_id": state.run_id,
        "events_total": state.events_total,
        "event_counts": dict(sorted(state.event_counts.items())),
        "bad_lines": {
            "counts": dict(sorted(state.bad_lines.counts.items())),
            "samples": [asdict(b) for b in state.bad_lines.samples],
        },
        "progress": None if state.progress is None else asdict(state.progress),
        "attempts": {str(n): asdict(state.attempts[n]) for n in sorted(state.attempts)},
        "series": {str(n): [list(p) for p in pts] for n, pts in state.series.items()},
        "checkpoints": {p: asdict(state.checkpoints[p]) for p in sorted(state.checkpoints)},
        "checkpoint_dirs": list(state.checkpoint_dirs),
        "replaced": state.replaced,
        "signals": [asdict(x) for x in state.signals],
        "requeues": [asdict(x) for x in state.requeues],
        "exceptions": [asdict(x) for x in state.exceptions],
        "anomalies": [asdict(x) for x in state.anomalies],
        "loggers": {n: asdict(state.loggers[n]) for n in sorted(state.loggers)},
        "commands": {i: asdict(state.commands[i]) for i in sorted(state.commands)},
        "ranks": {str(n): [asdict(r) for r in state.rank_info(n)] for n in sorted(state.attempts)},
        "alert_log": [asdict(x) for x in state.alert_log],
    }
