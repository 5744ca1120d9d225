"""ckptdash.submitit.preemptible without a cluster: a signal stop is not a result."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from ckptdash.submitit import STOPPED_EXIT_CODE, preemptible
from tests.train.helpers import fake_scontrol, send_self, slurm_env, state_of, train_loop


def test_a_signal_stopped_function_exits_without_a_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wrapped function saves and requeues on USR2, then its early return becomes an exit
    with no value (submitit writes no result); the requeued call returns the finished value."""
    fake_scontrol(tmp_path / "bin", tmp_path / "scontrol.log")
    slurm_env(monkeypatch, tmp_path / "bin", restart=0)
    run = tmp_path / "run"
    wrapped = preemptible(train_loop)

    def signal_at_5(step: int) -> None:
        if step == 5:
            send_self()

    with pytest.raises(SystemExit) as stopped:
        wrapped(run, total_steps=20, on_step=signal_at_5)
    assert stopped.value.code == STOPPED_EXIT_CODE
    assert [r.issued for r in state_of(run).requeues] == [True]

    slurm_env(monkeypatch, tmp_path / "bin", restart=1)
    assert wrapped(run, total_steps=20) == (6, 19)  # resumed after the signal save, finished


def _in_submitit_job(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """The environment submitit's SLURM job script and runner give the submitted function."""
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    monkeypatch.setenv("SUBMITIT_FOLDER", str(folder))
    submitit = pytest.importorskip("submitit", reason="install the test extra: make test")
    env = submitit.JobEnvironment()  # submitit itself agrees that this is one of its jobs
    assert env.activated() and env.cluster == "slurm"


def _signal_at(at: int) -> Callable[[int], None]:
    def maybe_signal(step: int) -> None:
        if step == at:
            send_self()

    return maybe_signal


def test_an_unwrapped_monitor_loop_in_a_submitit_job_leaves_no_partial_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """In a submitit job, a plain function whose loop is a ``with Monitor`` block needs no
    wrapper: after a USR2 save and requeue, leaving the block exits without a result (what
    preemptible() does), so submitit records none; the requeued call returns the finished
    value. Nothing is said at start-up: nothing needs wrapping."""
    fake_scontrol(tmp_path / "bin", tmp_path / "scontrol.log")
    slurm_env(monkeypatch, tmp_path / "bin", restart=0)
    _in_submitit_job(monkeypatch, tmp_path / "submitit")
    run = tmp_path / "run"
    after_the_block: list[object] = []

    def train(**kw: object) -> tuple[int, int | None]:
        result = train_loop(run, total_steps=20, **kw)  # type: ignore[arg-type]
        after_the_block.append(result)  # the early return submitit would record
        return result

    with pytest.raises(SystemExit) as stopped:
        train(on_step=_signal_at(5))
    assert stopped.value.code == STOPPED_EXIT_CODE
    assert after_the_block == []
    assert [r.issued for r in state_of(run).requeues] == [True]
    assert "not wrapped" not in capfd.readouterr().err

    slurm_env(monkeypatch, tmp_path / "bin", restart=1)
    assert train() == (6, 19)


def test_inside_preemptible_the_monitor_leaves_the_exit_to_the_wrapper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wrapped in preemptible(), code after the Monitor block still runs in a preempted
    attempt (as before); the wrapper then exits without a result."""
    fake_scontrol(tmp_path / "bin", tmp_path / "scontrol.log")
    slurm_env(monkeypatch, tmp_path / "bin", restart=0)
    _in_submitit_job(monkeypatch, tmp_path / "submitit")
    ran_after: list[bool] = []

    def train() -> None:
        train_loop(tmp_path / "run", total_steps=20, on_step=_signal_at(5))
        ran_after.append(True)

    with pytest.raises(SystemExit) as stopped:
        preemptible(train)()
    assert stopped.value.code == STOPPED_EXIT_CODE
    assert ran_after == [True]


def test_a_monitor_outside_a_with_block_in_a_submitit_job_says_to_wrap_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """A Monitor that is not a with block cannot end a preempted submitit attempt: at its first
    step ckptdash says, in one line, that the function must be wrapped in preemptible()."""
    import ckptdash

    _in_submitit_job(monkeypatch, tmp_path / "submitit")
    monkeypatch.setattr("ckptdash.train.ending.submitit_job._warned", False)
    monitor = ckptdash.Monitor(tmp_path / "run")
    monitor.step(0)
    monitor.step(1)
    monitor.close()
    lines = [line for line in capfd.readouterr().err.splitlines() if "not wrapped" in line]
    assert len(lines) == 1
    assert "ckptdash.submitit.preemptible(train)" in lines[0]
    assert "job.result()" in lines[0]


def test_the_lightning_callback_in_an_unwrapped_submitit_job_says_to_wrap_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """``fit()`` returns after a preemption and the submitted function goes on, so under
    submitit without preemptible() the Lightning callback says at start-up, in one line, that
    the function must be wrapped — and says nothing once it is."""
    pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")
    from tests.train.test_lightning import Tiny, callback, trainer

    _in_submitit_job(monkeypatch, tmp_path / "submitit")
    monkeypatch.setattr("ckptdash.train.ending.submitit_job._warned", False)
    run = tmp_path / "run"
    preemptible(lambda: trainer(run, 2, [callback(run)]).fit(Tiny()))()
    assert "not wrapped" not in capfd.readouterr().err
    trainer(run, 4, [callback(run)]).fit(Tiny())
    (line,) = [x for x in capfd.readouterr().err.splitlines() if "not wrapped" in x]
    assert line.startswith("ckptdash: ckptdash.lightning.CkptDashCallback in a submitit job")
    assert "submit ckptdash.submitit.preemptible(train) instead of train" in line
