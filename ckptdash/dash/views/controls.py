"""The controls: Save now, Stop after save, suspend/resume auto-requeue, pin/clear the resume
checkpoint.

Every click writes one command or one setting through :mod:`ckptdash.control`
and nothing else: the displayed state changes only when the follower reads
the file back (a pending command, a new setting) and, later, the training
side's answer. Every input is checked here, on the server — a run must be
one the dashboard lists, a pin must be a checkpoint that run recorded — so a
hand-made websocket message can do no more than the buttons.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import panel as pn

from ckptdash import control, humanize
from ckptdash.dash.feed.snapshot import RunSnapshot
from ckptdash.dash.model import DashModel, run_status
from ckptdash.dash.views.text import esc, relative
from ckptdash.dash.views.widgets import HtmlPane, button, confirmation, relabel
from ckptdash.errors import CkptDashError, ControlError
from ckptdash.ops import actions


def default_author() -> str:
    """``user@host (dashboard)``: who the audit trail names for a click in this process."""
    return f"{control.user_at_host()} (dashboard)"


def requeue_said(suspended: bool) -> str:
    """What a click on Suspend / Allow auto-requeue says it did to the run's setting."""
    return "auto-requeue suspended" if suspended else "auto-requeue resumed"


def command_answer(label: str, snap: RunSnapshot | None, command_id: str) -> str | None:
    """What the job answered to command ``command_id``, for the line under the buttons;
    None while it has not answered (pending or received)."""
    info = None if snap is None else next((c for c in snap.commands if c.id == command_id), None)
    if info is None:
        return None
    command_id = humanize.short_id(command_id)
    if info.status == "applied":
        what = relative(info.detail, snap.root) if snap is not None and info.detail else ""
        return f"{label} applied ({command_id})" + (f": {what}" if what else "")
    if info.status == "rejected":
        return f"{label} rejected ({command_id}): {info.reason or 'no reason given'}"
    if info.status == "expired":
        why = f": {info.reason}" if info.reason else ""
        return f"{label} expired ({command_id}) before a running attempt took it{why}"
    if info.status == "malformed":
        return f"{label} ({command_id}) could not be read: {info.error}"
    return None


def commands_off_reason(model: DashModel) -> str:
    """Why Save now and Stop are off for the selected run now, or "" when they are on.

    A command waits in the inbox until a running attempt takes it: on a run that finished,
    failed or went silent it would sit there until it expires, looking as if it worked.
    """
    snap = model.run
    if snap is None and not model.runs:
        return "waiting for the run to start (no attempt has written to it yet)"
    if snap is None:
        return "no run is selected"
    status, _ = run_status(snap, model.now, model.stale_after_s)
    if status == "finished":
        return "the run finished: no attempt is running to take a command"
    if status == "failed":
        return "the run failed: no attempt is running to take a command"
    if status in ("stopped", "terminated", "preempted", "lost"):
        return (
            f"the run is {status} and not requeued: no attempt is running to take a command"
            " (`ckptdash save RUN` queues one for a next attempt)"
        )
    if status == "stale":
        seen = snap.last_seen
        idle = 0.0 if seen is None else max(0.0, model.now - seen)
        return (
            f"no sign of life for {idle / 60:.0f} min — the command would wait for a next attempt"
        )
    return ""


class ControlActions:
    """What the buttons do, without the buttons: each method checks its input against the
    page's snapshot, carries out one :mod:`ckptdash.ops.actions` action (the same as the CLI's)
    and says what it did.

    ``author`` is asked at each action (a served page may know the logged-in
    user); ``nudge`` asks the follower to read the result back now; ``mirror_requeue``
    copies a new requeue setting onto the scheduler (see :mod:`ckptdash.dash.views.scheduler`)
    and says what it did, or "" when there is no scheduler to tell.

    ``locked``: why this page may not act (see ``DashOptions.controls_off``); every
    action then raises :class:`ControlError` with it and writes nothing. Checked here,
    not only by disabling buttons: a client can send a click for a disabled button.
    """

    def __init__(
        self,
        model: DashModel,
        *,
        author: Callable[[], str] = default_author,
        nudge: Callable[[], None] = lambda: None,
        mirror_requeue: Callable[[bool], str] = lambda suspended: "",
        locked: str = "",
    ) -> None:
        self.model = model
        self.locked = locked
        self._author = author
        self._nudge = nudge
        self._mirror_requeue = mirror_requeue
        self.last_command: tuple[str, str] | None = None
        """``(id, label)`` of the last command sent: the message line follows its answer."""

    def lock_message(self) -> str:
        return f"controls are off on this page: {self.locked}"

    def check_allowed(self) -> None:
        """Raise :class:`ControlError` when this page's controls are locked."""
        if self.locked:
            raise ControlError(self.lock_message())

    def _run(self) -> RunSnapshot:
        """The selected run, checked against the runs this dashboard lists (and the lock)."""
        self.check_allowed()
        snap: RunSnapshot | None = self.model.run
        if snap is None and not self.model.runs:
            raise ControlError("waiting for the run to start: no attempt has written to it yet")
        if snap is None or not any(r.root == snap.root for r in self.model.runs):
            raise ControlError("no run is selected; pick one in the run list")
        return snap

    def save_now(self) -> str:
        """Ask the job to save at its next step boundary (trigger ``manual``)."""
        snap = self._run()
        cmd = actions.save_now(snap.root, author=self._author())
        self.last_command = (cmd.id, "Save now")
        self._nudge()
        return f"Save now sent ({humanize.short_id(cmd.id)}); waiting for the job's answer"

    def stop_after_save(self) -> str:
        """Ask the job to save, then end without requeue (the view asks for confirmation)."""
        snap = self._run()
        cmd = actions.stop_after_save(snap.root, author=self._author())
        self.last_command = (cmd.id, "Stop after save")
        self._nudge()
        return f"Stop after save sent ({humanize.short_id(cmd.id)}); waiting for the job's answer"

    def set_requeue_suspended(self, suspended: bool) -> str:
        """Suspend (True) or resume (False) automatic requeue after preemption."""
        snap = self._run()
        if not isinstance(suspended, bool):
            raise ControlError(f"suspended={suspended!r}: must be True or False")
        actions.set_requeue(snap.root, suspended=suspended, author=self._author())
        self._nudge()
        said = requeue_said(suspended)
        # After the run's own setting: it holds even when the scheduler refuses the mirror.
        mirrored = self._mirror_requeue(suspended)
        return f"{said}; {mirrored}" if mirrored else said

    def pin(self, path: str) -> str:
        """Make the next attempt resume from ``path``: a valid checkpoint this run recorded
        (and, as from the CLI, lift a crash loop's requeue suspension)."""
        snap = self._run()
        if not isinstance(path, str) or path not in snap.valid_paths():
            raise ControlError(
                f"{path!r} is not a valid checkpoint of {snap.name}; pick a saved row of the"
                " checkpoint table"
            )
        changed = actions.pin(snap.root, path, author=self._author())
        self._nudge()
        said = f"pinned {Path(path).name}: the next attempt resumes from it"
        return f"{said}; {actions.LIFTED}" if changed.lifted_crash_loop else said

    def clear_pin(self) -> str:
        """Go back to the resume rule (newest valid checkpoint): no pin, no fresh start asked."""
        snap = self._run()
        actions.clear_pin(snap.root, author=self._author())
        self._nudge()
        return "resume pin cleared: the next attempt follows the resume rule"


class Controls(pn.viewable.Viewer):  # type: ignore[misc]
    """The buttons, the confirmation for Stop, and the outcome of the last click."""

    def __init__(self, model: DashModel, actions: ControlActions, **params: Any) -> None:
        super().__init__(**params)
        self.model = model
        self.actions = actions
        self.save_button = button("Save now", "primary")
        self.stop_button = button("Stop after save…", "danger")
        self.requeue_button = button("Suspend auto-requeue", "warning")
        self.clear_pin_button = button("Clear resume pin", disabled=True)
        self.confirm_button = button("Confirm stop", "danger")
        self.cancel_button = button("Cancel")
        self.message = HtmlPane(margin=(5, 10))
        self.off_reason = HtmlPane(margin=(0, 10))
        self._said_answer = ""
        self.confirm_row = confirmation(
            "Stop the job?",
            "It saves at the next step, then ends without requeue.",
            self.confirm_button,
            self.cancel_button,
        )
        self.save_button.on_click(lambda _: self.run_action(self.actions.save_now))
        self.stop_button.on_click(lambda _: self._ask_confirmation(True))
        self.cancel_button.on_click(lambda _: self._ask_confirmation(False))
        self.confirm_button.on_click(self._confirmed)
        self.requeue_button.on_click(self._toggle_requeue)
        self.clear_pin_button.on_click(lambda _: self.run_action(self.actions.clear_pin))
        self._suspended_shown = False
        self._layout = pn.Column(
            pn.Row(self.save_button, self.stop_button, self.requeue_button, self.clear_pin_button),
            self.off_reason,
            self.confirm_row,
            self.message,
            sizing_mode="stretch_width",
        )
        model.param.watch(self._render, ["run", "now", "stale_after_s"])
        self._render()

    def __panel__(self) -> Any:
        return self._layout

    def _render(self, *events: object) -> None:
        snap = self.model.run
        settings = None if snap is None else snap.settings
        suspended = bool(settings and settings.requeue_suspended)
        self._suspended_shown = suspended
        relabel(
            self.requeue_button,
            "Allow auto-requeue" if suspended else "Suspend auto-requeue",
            "success" if suspended else "warning",
        )
        locked = self.actions.locked
        self.requeue_button.disabled = snap is None or settings is None or bool(locked)
        self.clear_pin_button.disabled = not (settings and settings.resume_pin) or bool(locked)
        off = locked or commands_off_reason(self.model)
        self.save_button.disabled = self.stop_button.disabled = bool(off)
        what = "Controls are off" if locked else "Save now and Stop are off"
        shown = f"<div class='ck muted'>{what}: {esc(off)}</div>" if off else ""
        if self.off_reason.object != shown:
            self.off_reason.object = shown
        if off:
            self.confirm_row.visible = False
        self._follow_answer(snap)

    def _follow_answer(self, snap: RunSnapshot | None) -> None:
        """Replace "waiting for the job's answer" by the answer once the log has it."""
        last = self.actions.last_command
        if last is None:
            return
        answer = command_answer(last[1], snap, last[0])
        if answer is not None and answer != self._said_answer:
            self._said_answer = answer
            info = next(c for c in snap.commands if c.id == last[0]) if snap else None
            self.say(answer, problem=info is not None and info.status != "applied")

    def run_action(self, action: Callable[[], str]) -> None:
        """Run one action and show what it did, or why it could not."""
        before = self.actions.last_command
        said, problem = self.outcome(action)
        if self.actions.last_command is before:
            self.actions.last_command = None  # another action: its line is what to show now
        self._said_answer = ""
        self.say(said, problem=problem)
        self._follow_answer(self.model.run)  # an answer already read back (a fast job)

    @staticmethod
    def outcome(action: Callable[[], str]) -> tuple[str, bool]:
        """Run one action: what it said, or why it could not (then ``problem`` is True)."""
        try:
            return action(), False
        except (CkptDashError, OSError) as exc:
            return str(exc), True

    def say(self, message: str, *, problem: bool = False) -> None:
        """Show the outcome of the last click (local to this page; not run state)."""
        css = "ck problem" if problem else "ck"
        self.message.object = f"<div class='{css}'>{esc(message)}</div>"

    def _ask_confirmation(self, show: bool) -> None:
        self.confirm_row.visible = show

    def _confirmed(self, _: object) -> None:
        self.confirm_row.visible = False
        self.run_action(self.actions.stop_after_save)

    def _toggle_requeue(self, _: object) -> None:
        # Flip what the page shows: two people clicking at once ask for the same thing.
        wanted = not self._suspended_shown
        self.run_action(lambda: self.actions.set_requeue_suspended(wanted))
