"""Anomalies: a loss that goes non-finite or spikes is an ``anomaly`` event; ``stop`` ends the
attempt without a save; ``rollback`` pins the newest valid checkpoint from before the
divergence, requeues (SLURM's scontrol, faked) and the next attempt resumes from it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptdash
from ckptdash import control
from ckptdash.cli import render_status
from ckptdash.rundir import RunDir
from ckptdash.train.config import ConfigError, TrainConfig
from ckptdash.train.health.anomaly import ROLLBACK_AUTHOR, AnomalyWatch
from tests.train.helpers import fake_scontrol, slurm_env, state_of


def test_non_finite_and_spikes_are_anomalies_once_per_excursion() -> None:
    """NaN is an anomaly (value None); a value above factor × the recent median is a spike;
    while it stays bad nothing more is reported; a healthy value ends the excursion."""
    watch = AnomalyWatch("loss", factor=5.0, window=4)
    for step, loss in enumerate([2.0, 1.8, 1.6, 1.5]):
        assert watch.check(step, {"loss": loss}) is None
    spike = watch.check(4, {"loss": 9.0})  # median 1.7 → limit 8.5
    assert spike is not None and (spike.step, spike.value, spike.healthy_step) == (4, 9.0, 3)
    assert "9 > 5 × the median 1.7" in spike.reason
    assert watch.check(5, {"loss": math.nan}) is None  # the same excursion
    assert watch.check(6, {"loss": 1.4}) is None
    nan = watch.check(7, {"loss": math.inf})
    assert nan is not None and (nan.value, nan.healthy_step) == (None, 6)
    assert watch.check(8, {"acc": 0.5}) is None  # no loss in this heartbeat: nothing to judge


def test_configuration_says_what_to_use() -> None:
    """A wrong on_anomaly or factor is refused with the values that work."""
    with pytest.raises(ConfigError, match="'record', 'stop' or 'rollback'"):
        TrainConfig(run_dir="r", on_anomaly="explode")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="must be > 1"):
        TrainConfig(run_dir="r", anomaly_factor=0.5)


def loop(run: Path, *, steps: int, nan_at: int | None = None, **options: Any) -> list[int]:
    """A Monitor loop that saves every 10 steps and reports a NaN loss from ``nan_at`` on;
    returns the steps it ran."""
    options.setdefault("heartbeat_interval_s", 1e-6)  # a heartbeat (and a check) every step
    options.setdefault("agree_interval_s", 1e-6)
    ran = []
    model = torch.nn.Linear(2, 1)
    with ckptdash.Monitor(run, max_steps=steps, **options) as monitor:
        state = monitor.load()
        start = state["step"] + 1 if state is not None else 0
        for step in range(start, steps):
            ran.append(step)
            bad = nan_at is not None and step >= nan_at
            monitor.step(step, loss=math.nan if bad else 1.0 / (1 + step))
            if step % 10 == 0 and not monitor.should_stop:
                monitor.save({"model": model.state_dict(), "step": step})
            if monitor.should_save:
                monitor.save({"model": model.state_dict(), "step": step})
            if monitor.should_stop:
                break
    return ran


def test_record_keeps_training_and_leaves_one_event(tmp_path: Path) -> None:
    """By default an anomaly is only recorded: training runs to the end."""
    ran = loop(tmp_path / "run", steps=40, nan_at=25)
    assert ran[-1] == 39
    state = state_of(tmp_path / "run")
    (a,) = state.anomalies
    assert (a.step, a.metric, a.value, a.action, a.pinned) == (25, "loss", None, "record", None)
    assert state.attempts[0].outcome == "finished"


def test_stop_ends_the_attempt_without_saving_the_diverged_model(tmp_path: Path) -> None:
    """``stop``: training ends at the anomaly's step, no save after it, no requeue, and the
    attempt says it stopped for an anomaly."""
    ran = loop(tmp_path / "run", steps=40, nan_at=25, on_anomaly="stop")
    assert ran[-1] == 25
    state = state_of(tmp_path / "run")
    assert max(c.step or 0 for c in state.checkpoints.values()) == 20
    assert state.requeues == []
    assert (state.attempts[0].outcome, state.attempts[0].end_reason) == ("stopped", "anomaly")
    assert control.read_settings(tmp_path / "run").resume_pin is None


def test_rollback_pins_the_save_before_the_divergence_and_the_next_attempt_resumes_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rollback``: the loss is NaN from step 35 (saves at 0, 10, 20, 30; the last healthy
    heartbeat is 34): step 30 is pinned, the job requeues and stops; the next attempt
    resumes from step 30, and the pin, used once, is cleared."""
    run, log = tmp_path / "run", tmp_path / "scontrol.log"
    fake_scontrol(tmp_path / "bin", log)
    slurm_env(monkeypatch, tmp_path / "bin", restart=0)
    assert loop(run, steps=60, nan_at=35, on_anomaly="rollback")[-1] == 35
    state = state_of(run)
    (a,) = state.anomalies
    pinned = str(run / "checkpoints" / "step=30.ckpt")
    assert (a.step, a.action, a.pinned) == (35, "rollback", pinned)
    settings = control.read_settings(run)
    assert settings.resume_pin == pinned
    assert settings.updated_by.startswith(ROLLBACK_AUTHOR)
    assert log.read_text().split() == ["requeue", "4242"]
    assert state.attempts[0].end_reason == "anomaly"
    assert f"anomaly attempt 0 step 35: loss is nan (not finite) (rollback, pinned {pinned})" in (
        render_status(RunDir(run), state)
    )

    slurm_env(monkeypatch, tmp_path / "bin", restart=1)
    assert loop(run, steps=60, on_anomaly="rollback")[0] == 31
    state = state_of(run)
    assert state.attempts[1].resumed_from == pinned
    assert state.attempts[1].outcome == "finished"
    assert control.read_settings(run).resume_pin is None


def test_a_sticky_pin_set_by_a_person_stays_after_the_resume_that_used_it(tmp_path: Path) -> None:
    """Every pin is used once (a rollback's too), except a person's sticky pin
    (``ckptdash resume --pin PATH --sticky``), which stays until cleared."""
    run = tmp_path / "run"
    loop(run, steps=25)
    pinned = str(run / "checkpoints" / "step=10.ckpt")
    control.update_settings(run, resume_pin=pinned, sticky=True, author="ana@login1")
    assert loop(run, steps=25)[0] == 11
    assert control.read_settings(run).resume_pin == pinned
