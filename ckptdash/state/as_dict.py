"""A :class:`~ckptdash.state.RunState` as JSON-ready builtins, in a stable order: what
``ckptdash status --json`` prints and :meth:`RunState.to_dict` returns."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any


def as_dict(s: Any) -> dict[str, Any]:
    """The whole state ``s`` (a RunState) as JSON-ready builtins, in a stable order."""
    return {
        "root": s.root,
        "run_id": s.run_id,
        "events_total": s.events_total,
        "event_counts": dict(sorted(s.event_counts.items())),
        "bad_lines": {
            "counts": dict(sorted(s.bad_lines.counts.items())),
            "samples": [asdict(b) for b in s.bad_lines.samples],
        },
        "progress": None if s.progress is None else asdict(s.progress),
        "attempts": {str(n): asdict(s.attempts[n]) for n in sorted(s.attempts)},
        "series": {str(n): [list(p) for p in pts] for n, pts in s.series.items()},
        "checkpoints": {p: asdict(s.checkpoints[p]) for p in sorted(s.checkpoints)},
        "checkpoint_dirs": list(s.checkpoint_dirs),
        "replaced": s.replaced,
        "signals": [asdict(x) for x in s.signals],
        "requeues": [asdict(x) for x in s.requeues],
        "exceptions": [asdict(x) for x in s.exceptions],
        "anomalies": [asdict(x) for x in s.anomalies],
        "loggers": {n: asdict(s.loggers[n]) for n in sorted(s.loggers)},
        "commands": {i: asdict(s.commands[i]) for i in sorted(s.commands)},
        "ranks": {str(n): [asdict(r) for r in s.rank_info(n)] for n in sorted(s.attempts)},
        "alert_log": [asdict(x) for x in s.alert_log],
    }
