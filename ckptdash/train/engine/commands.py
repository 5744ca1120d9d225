"""Rank 0's end of the control channel for one attempt: claim, answer once, move to done/.

Every command gets exactly one outcome event in the log (``command_applied``,
``command_rejected`` or ``command_expired``) and is then moved to ``done/``. A
failure of the channel itself (an unreadable inbox, a file that cannot be moved)
is a ``control_failed`` event and a warning, never the end of training.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ckptdash import control
from ckptdash.errors import CkptDashError
from ckptdash.events import CommandExpired, CommandReceived, CommandRejected, ControlFailed
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter


class Commands:
    """The commands of one attempt. ``writer`` gives the event writer when one is needed."""

    def __init__(self, run: RunDir, writer: Callable[[], EventWriter]) -> None:
        self.run = run
        self._writer = writer
        # Command ids this run has received in any attempt: a file copied back into the
        # inbox after done/ is rejected, never applied twice.
        self.seen: set[str] = set()
        self._failures: set[tuple[str, str | None]] = set()
        # Where the listing of each inbox stands: each check lists for a few ms at most. The
        # owner's inbox has its own listing, so whatever floods the group's inbox (a run that
        # opted in to group steering) never delays the owner's commands past the next check.
        self._scan = control.InboxScan()
        self._group_scan = control.InboxScan()
        self.waiting: list[control.Claimed] = []
        """Claimed commands waiting for the save that was decided for them (rank 0)."""

    def claim(self, step: int) -> list[control.Claimed]:
        """Claim the inbox: the commands to apply at the next save (each recorded as
        received); replayed, malformed and expired ones are answered at once."""
        claimed_now: list[control.Claimed] = []
        for folder, scan in (("inbox", self._scan), ("group-inbox", self._group_scan)):
            try:
                # A file that cannot be claimed stays pending: an event says so, once.
                claimed_now += control.claim(
                    self.run,
                    on_problem=lambda r: self.failed(r, step),
                    scan=scan,
                    folder=folder,
                )
            except (CkptDashError, OSError) as exc:
                # The inbox being unusable must not end training: an event says why.
                self.failed(f"cannot take commands: {exc}", step)
        accepted: list[control.Claimed] = []
        for claimed in claimed_now:
            if claimed.id in self.seen:
                self.answer(
                    claimed,
                    CommandRejected,
                    step,
                    reason=f"replayed: command {claimed.id} was already received in this run;"
                    " a command is applied at most once (issue a new one)",
                )
                continue
            self.seen.add(claimed.id)
            self._writer().emit(
                CommandReceived,
                step=step,
                command_id=claimed.id,
                command=claimed.command_name,
                owner=claimed.owner or None,
                spoofed=claimed.spoofed,
            )
            if claimed.error is not None:
                self.answer(claimed, CommandRejected, step, reason=claimed.error)
            elif claimed.expired:
                self.answer(claimed, CommandExpired, step, reason="expired before the job saw it")
            else:
                accepted.append(claimed)
        return accepted

    def answer_waiting(
        self,
        step: int,
        kind: type[Any],
        also: list[control.Claimed] | None = None,
        **fields: Any,
    ) -> None:
        """Answer every command waiting for the decided save (and ``also``) with ``kind``:
        applied when it was made, rejected when it failed, expired when training ended."""
        waiting, self.waiting = [*self.waiting, *(also or [])], []
        for claimed in waiting:
            self.answer(claimed, kind, step, **fields)

    def answer(self, claimed: control.Claimed, kind: type[Any], step: int, **fields: Any) -> None:
        """Record the command's outcome (``kind`` with ``fields``), then move it to ``done/``."""
        self._writer().emit(
            kind, step=step, command_id=claimed.id, command=claimed.command_name, **fields
        )
        self.complete(claimed, step)

    def complete(self, claimed: control.Claimed, step: int) -> None:
        """Move an answered command to ``done/``; a failure is an event, never the end of
        training (the outcome is already in the log, so the command is not applied again)."""
        try:
            control.complete(self.run, claimed)
        except (CkptDashError, OSError) as exc:
            self.failed(str(exc), step, claimed.id)

    def failed(self, reason: str, step: int, command_id: str | None = None) -> None:
        """Report a control-channel failure: an event, and a warning for whoever reads stderr
        (once per reason and command in this attempt, however often it repeats)."""
        reason = control.safe_name(reason)
        if (reason, command_id) in self._failures:
            return
        self._failures.add((reason, command_id))
        warnings.warn(f"ckptdash: {reason}", RuntimeWarning, stacklevel=3)
        self._writer().emit(ControlFailed, step=step, reason=reason, command_id=command_id)
