"""One action, whoever asks: a pin, a clear or a fresh start from the dashboard (and so from
the notebook's widget, the same object) changes the run's settings exactly as the CLI's does
— a crash loop's requeue suspension lifted by a pin, a fresh-start request withdrawn by a
clear (issue 32, point 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptdash import control, events
from ckptdash.cli import main
from ckptdash.control.settings import CRASH_LOOP_AUTHOR
from ckptdash.dash.feed.snapshot import SnapshotBuilder
from ckptdash.dash.model import DashModel
from ckptdash.dash.views.controls import ControlActions
from ckptdash.errors import ControlError
from ckptdash.events import Settings
from ckptdash.ops import actions
from ckptdash.rundir.writer import EventWriter
from ckptdash.state import RunState
from tests.dash.conftest import T0, Scenario, ev, saved


def _crash_looped(root: Path) -> str:
    """A run that saved once and then failed twice the same way; requeue suspended by the
    crash loop, as ``ckptdash.train.ending.crash_loop.respond`` leaves it. Returns the
    checkpoint."""
    ckpt = str(root / "checkpoints" / "step=8.ckpt")
    with EventWriter(root, attempt=0, host="n0") as w:
        w.emit(events.RunStarted, max_steps=10)
        w.emit(
            events.CheckpointSaved,
            step=8,
            path=ckpt,
            trigger="periodic",
            size_bytes=10,
            duration_s=0.1,
        )
    control.update_settings(root, requeue_suspended=True, author=CRASH_LOOP_AUTHOR)
    return ckpt


def _dashboard_actions(root: Path, ckpt: str) -> ControlActions:
    """The dashboard's (and the notebook widget's) actions on a snapshot listing ``ckpt``."""
    scenario = Scenario(
        root=str(root), state=RunState(str(root), "r1"), builder=SnapshotBuilder(str(root))
    )
    scenario.add(ev(events.RunStarted, 0), saved(10, ckpt, 8))
    model = DashModel(path=str(root))
    model.publish(scenario.folder(T0 + 20))
    return ControlActions(model, author=lambda: "tester")


def _policy(settings: Settings) -> tuple[object, ...]:
    """What an action decided, without who and when (the pin as its file's name)."""
    return (
        settings.requeue_suspended,
        settings.resume_pin and Path(settings.resume_pin).name,
        settings.resume_pin_sticky,
        settings.fresh_start,
    )


def test_a_pin_from_the_dashboard_after_a_crash_loop_lifts_the_suspension(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The bug: the browser's pin left a crash loop's suspension in place, so the job never
    started to use the pin. Now the dashboard's pin lifts it and says so, and leaves the same
    settings as ``ckptdash resume RUN --pin``."""
    web, cli = tmp_path / "web", tmp_path / "cli"
    web_ckpt, cli_ckpt = _crash_looped(web), _crash_looped(cli)

    said = _dashboard_actions(web, web_ckpt).pin(web_ckpt)
    assert "back to auto" in said and "crash loop" in said
    assert main(["resume", str(cli), "--pin", cli_ckpt]) == 0
    assert actions.LIFTED in capsys.readouterr().out

    from_web, from_cli = control.read_settings(web), control.read_settings(cli)
    assert not from_web.requeue_suspended and from_web.resume_pin == web_ckpt
    assert _policy(from_web) == _policy(from_cli)


def test_a_suspension_set_by_hand_stays_after_a_pin_from_either_side(tmp_path: Path) -> None:
    """Only a crash loop's suspension is the pin's to lift: one a person set stays, from the
    dashboard as from the CLI."""
    root = tmp_path / "run"
    ckpt = _crash_looped(root)
    control.update_settings(root, requeue_suspended=True, author="alice@login")
    said = _dashboard_actions(root, ckpt).pin(ckpt)
    assert "back to auto" not in said
    assert control.read_settings(root).requeue_suspended
    assert main(["resume", str(root), "--pin", ckpt]) == 0
    assert control.read_settings(root).requeue_suspended


def test_clear_from_the_dashboard_also_withdraws_a_fresh_start(tmp_path: Path) -> None:
    """Clear means "back to the resume rule" on both sides: the dashboard's clear withdraws a
    waiting fresh-start request as ``ckptdash resume RUN --clear`` does."""
    web, cli = tmp_path / "web", tmp_path / "cli"
    ckpt = _crash_looped(web)
    _crash_looped(cli)
    for root in (web, cli):
        changed = actions.start_fresh(root)
        assert changed.lifted_crash_loop and changed.settings.fresh_start
    _dashboard_actions(web, ckpt).clear_pin()
    assert main(["resume", str(cli), "--clear"]) == 0
    from_web, from_cli = control.read_settings(web), control.read_settings(cli)
    assert not from_web.fresh_start and from_web.resume_pin is None
    assert _policy(from_web) == _policy(from_cli)


def test_a_policy_is_never_decided_by_truthiness(tmp_path: Path) -> None:
    """A hand-made message's ``"no"`` is not True: the action refuses it and writes nothing."""
    root = tmp_path / "run"
    _crash_looped(root)
    before = control.read_settings(root)
    with pytest.raises(ControlError, match=r"'no': must be True or False"):
        actions.set_requeue(root, suspended="no")  # type: ignore[arg-type]
    assert control.read_settings(root) == before
