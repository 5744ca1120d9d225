"""The scheduler's view of the selected run's job (SLURM, Grid Engine), and the controls only
the scheduler can carry out: hold, release or cancel a job that waits in the queue (e.g.
requeued).

Once a job is requeued no training process exists to read the run directory's control
channel, so these buttons ask the scheduler directly through its
:class:`~ckptdash.schedulers.base.Queue` (on the login node the dashboard runs on; the
examples below are SLURM's). The panel shows the scheduler's state next to the run's own
events: pending, running or held, the reason, the restart count.

``scontrol`` is never run on the follower's thread or the session's event loop to *refresh*:
one background thread per session asks SLURM at most every :data:`POLL_INTERVAL_S` seconds,
and only while the selected run has a SLURM job. Its answers reach the widgets the way the
follower's snapshots do (see :mod:`ckptdash.dash.delivery`). A click does not run ``scontrol``
either (Hold, Release, Cancel, and the Requeue=0/1 that Suspend / Allow auto-requeue mirrors
onto the job): it hands its command to the same thread and returns, so a slow controller never
holds up the page (each call has :data:`ckptdash.schedulers.slurm_queue.TIMEOUT_S`). After
Hold, Release or Cancel the three buttons stay off until the scheduler has answered; every
answer appears in the controls' message line.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import panel as pn

from ckptdash.dash.delivery import Delivery
from ckptdash.dash.model import DashModel
from ckptdash.dash.views.controls import Controls, requeue_said
from ckptdash.dash.views.text import esc
from ckptdash.dash.views.widgets import button, confirmation, html_pane
from ckptdash.errors import ControlError, SchedulerError
from ckptdash.ops import actions
from ckptdash.schedulers import job_of, queue_for
from ckptdash.schedulers.base import JobStatus, JobView, Queue, Runner

POLL_INTERVAL_S: Final = 3.0
"""Seconds between two refreshes of the scheduler's view (a state change shows within this)."""
UNAVAILABLE_RETRY_S: Final = 30.0
"""Seconds between refreshes while SLURM cannot be asked (a timeout costs up to 10 s)."""
UNAVAILABLE: Final = "scheduler commands not available here"


def render_scheduler(info: JobStatus) -> str:
    """The panel's HTML: the job's state, reason, hold and restarts, or why they are unknown."""
    head = f"<b>{esc(info.label)} job {esc(info.job_id or '')}</b>"
    if info.unavailable:
        body = f"<span class='muted'>{UNAVAILABLE}: {esc(info.unavailable)}</span>"
    elif not info.asked:
        body = f"<span class='muted'>asking {esc(info.label)} …</span>"
    elif info.error:
        body = f"<span class='problem'>{esc(info.error)}</span>"
    elif info.view is None:
        body = f"<span class='muted'>no longer known to {esc(info.label)} (ended and purged)</span>"
    else:
        v = info.view
        parts = [f"<span class='st'>{esc(v.state)}</span>"]
        if v.reason and v.reason != "None":
            parts.append(f"reason <code>{esc(v.reason)}</code>")
        if v.held:
            parts.append("<b>held</b>")
        if v.requeue is not None:
            parts.append("requeue " + ("on" if v.requeue else v.requeue_off))
        if v.restarts is not None:
            parts.append(f"restarts {v.restarts}")
        body = " · ".join(parts)
        if info.refused:
            body += f"<br><span class='problem'>controls off: {esc(info.refused)}</span>"
    return f"<div class='ck'>scheduler: {head}: {body}</div>"


class SchedulerPanel(pn.viewable.Viewer):  # type: ignore[misc]
    """The scheduler's view of the selected run's job, with Hold / Release / Cancel pending job.

    ``doc`` is the session's Bokeh document when served (None in a notebook) and
    ``render_lock`` the lock the notebook holds while it renders (the dashboard's
    :class:`~ckptdash.dash.delivery.Delivery`'s): refreshes from the background thread are
    applied under it, or once the served page has loaded (:meth:`ready`). ``runner`` replaces
    SLURM's commands
    in tests. Outcomes of clicks appear in ``controls``' message line. Call :meth:`close`;
    the thread also ends once ``alive()`` is false (the dashboard's follower stopped: a served
    session that was never closed, e.g. the server stopped before the browser left).
    """

    def __init__(
        self,
        model: DashModel,
        controls: Controls,
        *,
        doc: Any | None = None,
        render_lock: threading.RLock | None = None,
        runner: Runner | None = None,
        interval_s: float = POLL_INTERVAL_S,
        alive: Callable[[], bool] = lambda: True,
        **params: Any,
    ) -> None:
        super().__init__(**params)
        self.model = model
        self.controls = controls
        self.interval_s = interval_s
        self._alive = alive
        self._runner = runner
        # Answers from the background thread reach the widgets as the follower's snapshots do.
        self._post: Delivery[JobStatus] = Delivery(self._show, doc, render_lock=render_lock)
        self._say: Delivery[tuple[str, bool]] = Delivery(
            lambda said: controls.say(said[0], problem=said[1]), doc, render_lock=render_lock
        )
        self.info = JobStatus()
        self._job: str | None = None  # read by the background thread: guarded by _lock
        self._sched: Queue | None = None  # the job's scheduler: guarded by _lock
        self._root: str | None = None  # the selected run's folder: guarded by _lock
        self._again = False  # ask SLURM at once, not at the next refresh: guarded by _lock
        self._clicked: list[Callable[[], str]] = []  # clicks' commands, in order: under _lock
        # A click's command the background thread has taken and not yet answered (under _lock):
        # the next click is refused until then, not only while the command waits in _clicked.
        self._answering = False
        self._buttons_held = False  # off since a click, until SLURM's next answer is shown
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        self.status = html_pane(margin=(0, 10))
        self.hold_button = button("Hold pending job", "warning", disabled=True)
        self.release_button = button("Release job", "success", disabled=True)
        self.cancel_job_button = button("Cancel pending job…", "danger", disabled=True)
        self.confirm_cancel_button = button("Confirm cancel", "danger")
        self.keep_button = button("Keep it")
        self.confirm_row = confirmation(
            "Cancel the pending job?",
            "The scheduler removes it from the queue; the run keeps its checkpoints.",
            self.confirm_cancel_button,
            self.keep_button,
        )
        self.hold_button.on_click(lambda _: self._hand_over(self.hold, "hold"))
        self.release_button.on_click(lambda _: self._hand_over(self.release, "release"))
        self.cancel_job_button.on_click(lambda _: self._ask_confirmation(True))
        self.keep_button.on_click(lambda _: self._ask_confirmation(False))
        self.confirm_cancel_button.on_click(self._confirmed)
        self._layout = pn.Column(
            self.status,
            pn.Row(self.hold_button, self.release_button, self.cancel_job_button),
            self.confirm_row,
            visible=False,
            sizing_mode="stretch_width",
        )
        model.param.watch(self._on_run, ["run"])
        self._on_run()

    def __panel__(self) -> Any:
        return self._layout

    # --- actions (a click hands them to the background thread) -------------------------------

    def _hand_over(self, action: Callable[[], str], verb: str) -> None:
        """Queue a click's command for the background thread; say so, and hold the buttons."""
        if self.controls.actions.locked:
            self.controls.say(self.controls.actions.lock_message(), problem=True)
            return
        with self._lock:
            busy = bool(self._clicked) or self._answering
        if busy:
            self.controls.say(
                f"{self._label()} has not answered the last click yet; wait for it", problem=True
            )
            return
        # Said and held before the command is queued: the answer cannot arrive before this.
        self.controls.say(f"{self._name()} job {self._job}: asking {self._label()} to {verb} it …")
        self._buttons_held = True
        self.hold_button.disabled = self.release_button.disabled = True
        self.cancel_job_button.disabled = True
        self._queue(action)

    def _queue(self, action: Callable[[], str]) -> None:
        with self._lock:
            self._clicked.append(action)
        self._start()
        self._wake.set()

    def hold(self) -> str:
        """Keep the pending job from starting (``scontrol hold``, ``qhold``)."""
        self.controls.actions.check_allowed()
        job, sched, root = self._require_job()
        view = actions.hold(sched, job, run_root=root)
        self._answered(job, view)
        return f"{sched.name} job {job}: held ({view.describe()}); Release job lets it start"

    def release(self) -> str:
        """Let a held job be scheduled again (``scontrol release``, ``qrls``)."""
        self.controls.actions.check_allowed()
        job, sched, root = self._require_job()
        view = actions.release(sched, job, run_root=root)
        self._answered(job, view)
        return f"{sched.name} job {job}: released ({view.describe()})"

    def cancel_pending(self) -> str:
        """Cancel the job while it waits in the queue (``scancel --state=PENDING``, ``qdel``)."""
        self.controls.actions.check_allowed()
        job, sched, root = self._require_job()
        after = actions.cancel_pending(sched, job, run_root=root)
        self._answered(job, after)
        state = after.describe() if after is not None else "gone from the queue"
        return f"{sched.name} job {job}: cancelled while pending ({state})"

    def mirror_requeue(self, suspended: bool) -> str:
        """Mirror the run's new requeue setting onto its job's own requeue switch (SLURM's
        Requeue=0/1, Grid Engine's ``-r n/y``), as the CLI does.

        The panel's thread asks the scheduler, and its answer replaces the message line; this
        returns what to say meanwhile, or "" when there is nothing to tell (no scheduler job, no
        scheduler commands here)."""
        with self._lock:
            job, sched, root = self._job, self._sched, self._root
        if job is None or sched is None or not sched.available():
            return ""
        flag = sched.switch(not suspended)
        if self.info.job_id == job and self.info.unavailable:
            # Known unreachable: nothing to ask, and no timeout to wait for.
            return (
                f"{sched.name} job {job}: {sched.switch_name} not changed: {self.info.unavailable}"
            )

        def mirror() -> str:
            # Replaces the click's whole message line, so it repeats the setting's part.
            try:
                answer = actions.mirror_requeue(sched, job, allowed=not suspended, run_root=root)
            except SchedulerError as exc:  # refused: nothing was sent to the scheduler
                raise type(exc)(f"{requeue_said(suspended)}; {exc}") from None
            return f"{requeue_said(suspended)}; {answer}"

        self._queue(mirror)
        return f"{sched.name} job {job}: asking {sched.label} to set {flag} …"

    def _require_job(self) -> tuple[str, Queue, str]:
        """The selected run's job, its scheduler and run directory; the action verifies the
        job (yours, and started by this run: its log alone does not decide) and refuses it,
        shown on the page, if not."""
        # The job's state is not checked here: the action asks the scheduler, which refuses
        # (hold of a running job; scancel --state=PENDING) whatever a stale page showed.
        with self._lock:
            job, sched, root = self._job, self._sched, self._root
        if job is None or sched is None or root is None:
            raise ControlError("the selected run has no scheduler job; nothing to ask")
        return job, sched, root

    def _name(self) -> str:
        return self._sched.name if self._sched is not None else "scheduler"

    def _label(self) -> str:
        return self._sched.label if self._sched is not None else "the scheduler"

    def _status(self, job: str | None, **kw: Any) -> JobStatus:
        sched = self._sched
        if sched is None:
            return JobStatus(job, **kw)
        return JobStatus(job, scheduler=sched.name, label=sched.label, **kw)

    def _answered(self, job: str, view: JobView | None) -> None:
        # On the background thread: shown through the delivery, like a refresh (which follows).
        self._post(self._status(job, asked=True, view=view))

    def _ask_confirmation(self, show: bool) -> None:
        self.confirm_row.visible = show

    def _confirmed(self, _: object) -> None:
        self.confirm_row.visible = False
        self._hand_over(self.cancel_pending, "cancel")

    # --- showing ---------------------------------------------------------------------------

    def _on_run(self, *events: object) -> None:
        """A new snapshot (any run change): follow the selected run's job."""
        run = self.model.run
        found = None if run is None else job_of(run.attempts)
        job = None if found is None else found[1]
        sched = None if found is None else queue_for(found[0], self._runner)
        with self._lock:
            before = None if self._sched is None else self._sched.name
            changed = job != self._job or (None if sched is None else sched.name) != before
            if changed:
                self._sched = sched
            self._job = job
            self._root = None if run is None else run.root
        if changed:
            self.confirm_row.visible = False
            self._show(self._status(job))
            if job is not None:
                self._start()
                self._wake.set()

    def _show(self, info: JobStatus) -> None:
        """Apply ``info`` to the widgets (on the session's thread, or under the render lock)."""
        if info.job_id != self._job:
            return  # an answer about the run that was selected before
        if info.key() == self.info.key() and self.status.object and not self._buttons_held:
            return  # unchanged: the page is not sent the same thing again
        self.info = info
        self.status.object = render_scheduler(info)
        self._layout.visible = info.job_id is not None
        with self._lock:
            queued = bool(self._clicked)
        if queued:
            return  # the buttons wait until the background thread has taken that click
        self._buttons_held = False
        locked = bool(self.controls.actions.locked)
        self.hold_button.disabled = not info.can_hold or locked
        self.release_button.disabled = not info.can_release or locked
        self.cancel_job_button.disabled = not info.can_cancel or locked
        if not info.can_cancel:
            self.confirm_row.visible = False

    # --- the background thread ---------------------------------------------------------------

    def _start(self) -> None:
        # Only once a scheduler's job is selected: other runs never start a thread.
        if self._thread is None and not self._closed.is_set():
            self._thread = threading.Thread(
                target=self._loop, name="ckptdash-scheduler", daemon=True
            )
            self._thread.start()

    def _loop(self) -> None:
        asked: str | None = None
        due = 0.0
        while not self._closed.is_set() and self._alive():
            self._wake.clear()  # before reading the job: a wake-up after this is not lost
            with self._lock:
                job, again, self._again = self._job, self._again, False
                clicked = self._clicked.pop(0) if self._clicked else None
                self._answering = clicked is not None
            if clicked is not None:
                try:
                    self._say(self.controls.outcome(clicked))
                finally:
                    with self._lock:
                        self._answering = False
                self.refresh()  # the view after the click: it also frees the buttons
                continue
            now = time.monotonic()
            if job is not None and (again or job != asked or now >= due):
                info = self.ask(job)
                asked = job
                pause = UNAVAILABLE_RETRY_S if info.unavailable else self.interval_s
                due = time.monotonic() + pause
                self._post(info)
            # Bounded even with no job to ask about: alive() is checked at least this often.
            self._wake.wait(self.interval_s if job is None else max(0.0, due - time.monotonic()))

    def ask(self, job: str) -> JobStatus:
        """The scheduler's view of ``job`` now (runs ``scontrol``/``qstat``: call it off the
        event loop)."""
        with self._lock:
            sched = self._sched
            root = self._root if self._job == job else None
        if sched is None:
            return JobStatus(job, asked=True, unavailable="no scheduler to ask")
        if not sched.available():
            return sched.unavailable_status(job, sched.missing())
        status = sched.job_status(job)
        if status.view is not None and root is not None:
            # The buttons are off for a job the page may not act on; a click is refused anyway.
            refused = sched.refusal(status.view, run_root=root)
            status = dataclasses.replace(status, refused=refused)
        return status

    def refresh(self) -> None:
        """Ask the scheduler again now (the background thread does it)."""
        with self._lock:
            self._again = True
        self._wake.set()

    def ready(self) -> None:
        """The served page has loaded: show the scheduler's answers from now on."""
        self._post.ready()
        self._say.ready()

    def close(self) -> None:
        """Stop the background thread (it ends after a command in flight) and its updates."""
        self._closed.set()
        self._post.close()
        self._say.close()
        self._wake.set()
