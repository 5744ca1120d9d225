"""The events feed: what happened to each attempt, in words, newest first.

"What happened to my job?" in one glance: it started (or resumed from which checkpoint),
got a signal, saved on it, asked for a requeue, was killed without warning and lost N steps,
answered a command, ended. Built from the run snapshot only (no file I/O): the sentences
come from :func:`feed_entries`, which tests and the notebook can call without Panel.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from ckptdash import humanize
from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.dash.views.text import esc, relative
from ckptdash.dash.views.widgets import HtmlView
from ckptdash.state.records import AttemptInfo, CheckpointInfo

NOTABLE_TRIGGERS: Final = frozenset({"signal", "manual", "final", "exception", "api"})
"""Saves worth a line of their own; periodic saves are the checkpoint table's."""


@dataclass(frozen=True)
class FeedEntry:
    """One line of the feed: when, which attempt, what happened (``kind`` for the style)."""

    t: float
    attempt: int | None
    kind: str
    """``start``, ``signal``, ``save``, ``requeue``, ``lost``, ``command``, ``end``, ``problem``."""
    text: str


def feed_entries(snap: RunSnapshot, limit: int = 40) -> list[FeedEntry]:
    """The feed of ``snap``, newest first, at most ``limit`` entries."""
    entries = [*_attempt_entries(snap), *_signal_entries(snap), *_save_entries(snap)]
    entries += [*_requeue_entries(snap), *_command_entries(snap), *_exception_entries(snap)]
    entries.sort(key=lambda e: (e.t, _ORDER.get(e.kind, 5)), reverse=True)
    return entries[:limit]


# Within one moment, the story reads: signal, save, requeue, end (newest first reverses it).
_ORDER: Final = {"start": 0, "signal": 1, "save": 2, "command": 3, "requeue": 4, "lost": 5}


def _attempt_entries(snap: RunSnapshot) -> Iterator[FeedEntry]:
    by_path = {c.path: c for c in snap.checkpoints}
    attempts = list(snap.attempts)
    for i, a in enumerate(attempts):
        n = a.attempt
        if a.started_at is not None:
            where = f" on {a.host}" if a.host else ""
            if a.resumed_from:
                ck = by_path.get(a.resumed_from)
                step = f" (step {ck.step})" if ck is not None and ck.step is not None else ""
                what = f"resumed from {relative(a.resumed_from, snap.root)}{step}"
            else:
                what = "started from scratch"
            yield FeedEntry(a.started_at, n, "start", f"attempt {n} {what}{where}")
        nxt = attempts[i + 1] if i + 1 < len(attempts) else None
        if a.outcome == "lost":
            yield _lost(snap, a, nxt, by_path)
        elif a.ended_at is not None:
            yield FeedEntry(a.ended_at, n, "end", _ended(a))


def _ended(a: AttemptInfo) -> str:
    at = f" at step {a.step}" if a.step is not None else ""
    if a.outcome == "finished":
        return f"attempt {a.attempt} finished the training{at}"
    if a.outcome == "failed":
        return f"attempt {a.attempt} failed{at}: {a.end_reason or 'no reason given'}"
    return f"attempt {a.attempt} stopped{at} ({a.end_reason or 'no reason given'})"


def _lost(
    snap: RunSnapshot, a: AttemptInfo, nxt: AttemptInfo | None, by_path: dict[str, CheckpointInfo]
) -> FeedEntry:
    """A killed attempt: the steps the next attempt redoes (from the checkpoint it resumed
    from, else this attempt's own newest save)."""
    t = a.last_heartbeat_t or a.started_at or 0.0
    base: CheckpointInfo | None = None
    if nxt is not None and nxt.resumed_from:
        base = by_path.get(nxt.resumed_from)
    if base is None:
        own = [c for c in snap.checkpoints if c.attempt == a.attempt and c.status == "saved"]
        base = max(own, key=lambda c: c.step or 0, default=None)
    text = f"attempt {a.attempt} went silent"
    if a.step is not None:
        text += f" at step {a.step}"
    text += " without saying it ended (killed without warning)"
    if a.step is not None and base is not None and base.step is not None:
        lost = max(0, a.step - base.step)
        text += f": {lost} steps lost since its checkpoint at step {base.step}"
    elif a.step is not None:
        text += ": no checkpoint to resume from"
    return FeedEntry(t, a.attempt, "lost", text)


def _signal_entries(snap: RunSnapshot) -> Iterator[FeedEntry]:
    for s in snap.signals:
        at = f" at step {s.step}" if s.step is not None else ""
        rank = f" (rank {s.rank})" if s.rank else ""
        yield FeedEntry(
            s.t,
            s.attempt,
            "signal",
            f"attempt {s.attempt} got {s.signal}{rank}{at}: {s.action}",
        )


def _save_entries(snap: RunSnapshot) -> Iterator[FeedEntry]:
    for c in snap.checkpoints:
        if c.t is None:
            continue
        who = f"attempt {c.attempt}" if c.attempt is not None else "the job"
        path = relative(c.path, snap.root)
        if c.status == "failed" and c.error:
            yield FeedEntry(c.t, c.attempt, "problem", f"{who} failed to save {path}: {c.error}")
        elif c.trigger in NOTABLE_TRIGGERS and c.status in ("saved", "removed"):
            took = f" in {humanize.duration(c.duration_s)}" if c.duration_s is not None else ""
            yield FeedEntry(c.t, c.attempt, "save", f"{who} saved {path} ({c.trigger}){took}")


def _requeue_entries(snap: RunSnapshot) -> Iterator[FeedEntry]:
    for r in snap.requeues:
        if r.issued:
            text = f"attempt {r.attempt} asked the scheduler to requeue the job"
        else:
            text = f"attempt {r.attempt} was not requeued: {r.reason or 'no reason given'}"
        yield FeedEntry(r.t, r.attempt, "requeue", text)


def _command_entries(snap: RunSnapshot) -> Iterator[FeedEntry]:
    for c in snap.commands:
        if c.resolved_at is None or c.status not in ("applied", "rejected", "expired"):
            continue
        name = f"{c.command or 'command'} {humanize.short_id(c.id)}"
        by = f" from {c.author}" if c.author else ""
        if c.status == "applied":
            what = f": {relative(c.detail, snap.root)}" if c.detail else ""
        else:
            what = f": {c.reason or 'no reason given'}"
        who = f"attempt {c.attempt}" if c.attempt is not None else "the job"
        yield FeedEntry(c.resolved_at, c.attempt, "command", f"{who} {c.status} {name}{by}{what}")


def _exception_entries(snap: RunSnapshot) -> Iterator[FeedEntry]:
    for e in snap.exceptions:
        where = f" at step {e.step}" if e.step is not None else ""
        yield FeedEntry(
            e.t,
            e.attempt,
            "problem",
            f"attempt {e.attempt} raised {e.error_type}{where}: {e.message}",
        )


class EventsFeed(HtmlView):
    """The feed under the header: newest first, one line each, with the local time."""

    LIMIT: Final = 40

    def __init__(self, model: Any, **params: Any) -> None:
        self._shown = ""
        super().__init__(model, **params)

    def html(self) -> str:
        snap = self.model.run
        if snap is None:
            return ""
        rows = "".join(
            f"<li class='feed-{esc(e.kind)}'><span class='muted'>{humanize.clock(e.t)}</span> "
            f"{esc(e.text)}</li>"
            for e in feed_entries(snap, self.LIMIT)
        )
        body = f"<ul class='feed'>{rows}</ul>" if rows else "<span class='muted'>none yet</span>"
        return f"<div class='ck'><h4>What happened</h4>{body}</div>"

    def _render(self, *events: object) -> None:
        shown = self.html()
        if shown != self._shown:  # a heartbeat changes nothing here: send nothing
            self._shown = shown
            self._pane.object = shown
