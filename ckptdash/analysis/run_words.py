"""The run's state in one word, the same on the command line and on the dashboard.

``ckptdash status FOLDER`` (:func:`ckptdash.cli.status.run_word`) and the dashboard's header
badge (:func:`ckptdash.dash.model.run_status`) both ask :func:`run_word`, so an attempt a
Ctrl-C (SIGTERM) ended reads "terminated" in both, not "preempted" in one and "stopped" in the
other. Plain Python: the CLI imports it without the dashboard.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal, TypeAlias, get_args

from ckptdash.state.records import AttemptInfo, LoggerInfo, RequeueInfo, SignalInfo

RunWord: TypeAlias = Literal[
    "waiting",
    "running",
    "stale",
    "lost",
    "preempted",
    "terminated",
    "requeue pending",
    "stopped",
    "finished",
    "failed",
]
RUN_WORDS: Final[tuple[RunWord, ...]] = get_args(RunWord)


def run_word(
    newest: AttemptInfo | None,
    requeues: Iterable[RequeueInfo],
    signals: Iterable[SignalInfo],
    now: float,
    stale_after_s: float,
) -> RunWord:
    """The state of a run whose newest attempt is ``newest``.

    ``terminated``: it ended on SIGTERM without a requeue (Ctrl-C, ``scancel``, a time limit);
    ``preempted``: it ended on the requeue signal (or a scheduler's preemption) and was not
    requeued; ``lost``: the training side says its process is gone without a word.
    """
    if newest is None:
        return "waiting"
    n = newest.attempt
    if newest.outcome == "running":
        seen = newest.last_heartbeat_t
        return "stale" if seen is not None and now - seen > stale_after_s else "running"
    if newest.outcome in ("finished", "failed", "lost"):
        return newest.outcome
    if any(r.issued for r in requeues if r.attempt == n):
        return "requeue pending"
    if newest.end_reason == "terminated":
        return "terminated"
    if newest.end_reason == "preempted" or any(s.attempt == n for s in signals):
        return "preempted"
    return "stopped"


def logger_line(info: LoggerInfo) -> str:
    """One line for ``ckptdash status`` and the dashboard: which logger run, where."""
    where = f" in {info.location}" if info.location else ""
    named = " (named by the user)" if info.named else ""
    since = "" if info.step is None else f", attempt {info.attempt} from step {info.step}"
    redone = f", later steps {info.redone}" if info.redone else ""
    return f"{info.logger} {info.id or '?'}{where}{named}{since}{redone}"
