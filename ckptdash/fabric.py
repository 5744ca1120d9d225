"""Lightning Fabric through ckptdash: signals, saves through ``fabric.save``, the resume recorded.

    fabric = L.Fabric(accelerator="cpu")
    fabric.launch()                                   # before the monitor: ranks exist now
    model, optimizer = fabric.setup(model, optimizer)
    state = {"model": model, "optimizer": optimizer, "step": -1}
    with ckptdash.fabric.FabricMonitor(fabric, "runs/exp1", max_steps=1000) as monitor:
        monitor.load(state)                           # restores in place; None: fresh start
        for step in range(state["step"] + 1, 1000):
            ...                                       # forward, fabric.backward, step
            monitor.step(step, loss=loss.item())
            if monitor.should_save:                   # signal, Save now, Stop after save
                state["step"] = step
                monitor.save(state)
            if monitor.should_stop:
                break

Fabric has no Trainer loop for a callback to hook into: the loop is yours, so ckptdash
takes part the way :class:`~ckptdash.Monitor` does, with Fabric doing the writing and the
loading. ``CkptDashCallback`` is the *Trainer's* callback; given to ``L.Fabric(callbacks=...)``
it raises :class:`~ckptdash.errors.WrongFrameworkError` at ``fabric.setup``.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

from ckptdash.errors import WrongFrameworkError
from ckptdash.events import Trigger
from ckptdash.resume import ResumeChoice
from ckptdash.train.checkpoints.saving import META_KEY
from ckptdash.train.engine.decision import Decision
from ckptdash.train.monitor import Monitor

__all__ = ["FabricMonitor"]


class FabricMonitor:
    """A :class:`~ckptdash.Monitor` whose saves go through ``fabric.save`` and whose resume
    is ``fabric.load(path, state)``, recorded.

    Create it after ``fabric.launch()``, on every rank; ``run_dir`` and any
    :class:`~ckptdash.TrainConfig` field may be given as keywords, as for ``Monitor``.
    Everything else of the Monitor (``record``, ``saving``, ``declare_checkpoint_dir`` ...)
    is on :attr:`monitor`.
    """

    def __init__(
        self,
        fabric: Any,
        run_dir: str | os.PathLike[str] | None = None,
        *,
        max_steps: int | None = None,
        **options: Any,
    ) -> None:
        from ckptdash.lightning import compat  # Lightning's internals, in one place

        if not compat.fabric_launched(fabric) and getattr(fabric, "world_size", 1) > 1:
            raise WrongFrameworkError(
                "ckptdash.fabric.FabricMonitor: call fabric.launch() before creating it, so"
                " that every rank exists and takes part in ckptdash's decisions"
            )
        self.fabric = fabric
        self.monitor = Monitor(run_dir, max_steps=max_steps, **options)

    # --- resume ------------------------------------------------------------------------------

    @property
    def resume_choice(self) -> ResumeChoice:
        """The resume rule's answer for this attempt (:attr:`ckptdash.Monitor.resume_choice`)."""
        return self.monitor.resume_choice

    def load(
        self, state: dict[str, Any], *, strict: bool = True, weights_only: bool = True
    ) -> dict[str, Any] | None:
        """``fabric.load(path, state)`` from the resume rule's choice, then ``run_resumed``.

        Restores ``state`` in place (modules, optimizers and plain values alike) and
        returns what Fabric returns (the items ``state`` did not name); None on a fresh
        start, ``state`` untouched. ``weights_only=True`` as :meth:`ckptdash.Monitor.load`:
        a swapped file cannot run code when it is unpickled.
        """
        path = self.monitor.resume_choice.path
        if path is None:
            return None
        remainder: dict[str, Any] = self.fabric.load(
            path, state, strict=strict, weights_only=weights_only
        )
        self.monitor.resume_path()  # recorded once it loaded
        return remainder

    def resume_path(self) -> str | None:
        """The validated checkpoint, recorded as resumed from, for loading it yourself."""
        return self.monitor.resume_path()

    # --- the loop ----------------------------------------------------------------------------

    def step(self, step: int, *, epoch: int | None = None, **metrics: Any) -> Decision | None:
        """Call once per optimizer step, after it, on every rank. Cheap unless a check is due."""
        return self.monitor.step(step, epoch=epoch, **metrics)

    @property
    def should_save(self) -> bool:
        """A save was decided (signal or command): call :meth:`save` before the next step."""
        return self.monitor.should_save

    @property
    def should_stop(self) -> bool:
        """Training should end now (after a signal save, or a Stop after save command)."""
        return self.monitor.should_stop

    @property
    def attempt(self) -> int:
        return self.monitor.attempt

    def save(
        self,
        state: dict[str, Any],
        path: str | os.PathLike[str] | None = None,
        *,
        trigger: Trigger | None = None,
    ) -> None:
        """``fabric.save`` of ``state`` onto ``path``, atomically, and recorded.

        Call it on every rank, as ``fabric.save`` wants: Fabric writes (one file from rank
        0, or a directory of shards from every rank) into a temp name next to ``path``,
        which ckptdash then fsyncs and renames into place. ``path`` defaults to
        ``checkpoints/step=N.ckpt`` in the run directory, ``trigger`` to the pending
        decision's or ``api``; the state carries ckptdash's metadata under ``"ckptdash"``.
        """
        session = self.monitor.session
        decision = session.decision
        trig: Trigger = trigger or (decision.trigger if decision else "api")
        target = (
            Path(path)
            if path is not None
            else self.monitor.config.checkpoint_path / f"step={session.step}.ckpt"
        )
        stamped = {**state, META_KEY: session.metadata(trig)}
        with self.monitor.saving(target, trigger=trigger) as temp:
            self.fabric.save(temp, stamped)

    def stop(self) -> None:
        """Ask the loop to end (sets :attr:`should_stop`)."""
        self.monitor.stop()

    def close(self, error: BaseException | None = None) -> None:
        """Record how the attempt ended and restore the signal handlers."""
        self.monitor.close(error)

    def __enter__(self) -> FabricMonitor:
        self.monitor.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.monitor.__exit__(exc_type, exc, tb)
