"""ckptdash.submitit.preemptible without a cluster: a signal stop is not a result."""

from __future__ import annotations

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
