"""Signals that reach one rank of a 2-rank gloo job (torchrun) at the very end of training —
in the last step, or after the loop — with short steps: none may vanish.

A rank agrees with the others only every few steps (about once per ``agree_interval_s``), so
a signal that arrived after the last agreement used to be dropped when training ended: no
``signal_received``, no save, the run "completed" (seen with FSDP2 in 1 of 2 runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ckptdash.state.reading import load_state
from tests.train.test_distributed import job_env, launch  # noqa: F401  (launch: a fixture)

pytestmark = pytest.mark.integration

STEPS = 24  # x 5 ms; the worker agrees every 0.05 s: the last step is (almost) never a check


def test_signals_to_rank_1_in_the_last_step_and_after_the_loop_are_acted_on_and_recorded(
    tmp_path: Path,
    launch: Any,  # noqa: F811
) -> None:
    """A Monitor loop; SIGUSR2 on rank 1 during the last step: the last step boundary is always
    an agreement, so both ranks save there (trigger ``signal``) and rank 0 requeues. Another
    SIGUSR2 on rank 1 after the loop, while its Monitor block is still open: nothing is left to
    save or requeue, but rank 1 records it (``signal_received`` in its own file)."""
    run = tmp_path / "run"
    r0, r1 = launch(
        "monitor", job_env(tmp_path, slurm_restart=0), "monitor", run,
        f"--steps={STEPS}", f"--signal-at={STEPS - 1}", "--signal-after-loop",
    ).wait()  # fmt: skip
    assert r0["saves"] == r1["saves"] == [STEPS - 1]
    state = load_state(run)
    assert [(s.rank, s.signal, s.action) for s in state.signals] == [
        (1, "SIGUSR2", "requeue"),
        (1, "SIGUSR2", "requeue"),
    ]
    (ckpt,) = state.checkpoints.values()
    assert (ckpt.trigger, ckpt.step, ckpt.status) == ("signal", STEPS - 1, "saved")
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]  # once
    assert state.attempts[0].end_reason == "preempted"


def test_a_signal_to_rank_1_in_the_last_fsdp2_step_is_saved_and_recorded(
    tmp_path: Path,
    launch: Any,  # noqa: F811
) -> None:
    """The same with FSDP2 (ModelParallelStrategy, 2 CPU ranks) under Lightning, where the
    signal used to vanish: SIGUSR2 on rank 1 in the last training step → one signal save of
    the shards at the final global step, a requeue, and the signal on record for rank 1."""
    pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")
    run = tmp_path / "run"
    r0, r1 = launch(
        "fsdp2", job_env(tmp_path, slurm_restart=0), "lightning", run,
        f"--steps={STEPS}", f"--signal-at={STEPS - 1}", "--sharded",
    ).wait()  # fmt: skip
    assert r0["saves"] == r1["saves"] == [STEPS]  # Lightning counts the step after it
    state = load_state(run)
    assert [(s.rank, s.signal, s.action) for s in state.signals] == [(1, "SIGUSR2", "requeue")]
    (ckpt,) = state.checkpoints.values()
    assert (ckpt.trigger, ckpt.step, ckpt.status) == ("signal", STEPS, "saved")
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
