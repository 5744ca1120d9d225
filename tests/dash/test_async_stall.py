"""Asynchronous saves on the dashboard: the table shows the stall beside the save time, and
goodput counts only the stall as time lost to saving."""

from __future__ import annotations

import pytest

from ckptdash.analysis import preemption
from ckptdash.dash.views.checkpoints import checkpoint_frame
from tests.dash.conftest import Scenario, preempted_run, saved


def test_the_checkpoint_table_shows_the_stall_beside_the_save_time(scenario: Scenario) -> None:
    """A background save shows its whole time under "save s" and its stall under "stall s";
    a synchronous one (no blocking_s) stalled for all of its save time."""
    scenario.add(
        saved(100, "/ck/async.ckpt", 100, duration_s=3.0, blocking_s=0.05),
        saved(200, "/ck/sync.ckpt", 200, duration_s=2.0),
    )
    frame = checkpoint_frame(scenario.snapshot()).set_index("file")
    assert frame.loc["/ck/async.ckpt", ["save s", "stall s"]].tolist() == [3.0, 0.05]
    assert frame.loc["/ck/sync.ckpt", ["save s", "stall s"]].tolist() == [2.0, 2.0]


def test_goodput_counts_only_the_stall_of_a_background_save(scenario: Scenario) -> None:
    """With every save asynchronous (2 s to durable, 0.1 s stall), the saving share and the
    Young/Daly save cost use the 0.1 s stall, not the 2 s persist."""
    run = [
        e.__class__(**{**{f: getattr(e, f) for f in e.__struct_fields__}, "blocking_s": 0.1})
        if e.KIND == "checkpoint_saved"
        else e
        for e in preempted_run()
    ]
    scenario.add(*run)
    g = preemption.compute(scenario.snapshot())
    assert g.saves == 4
    assert g.saving_share == pytest.approx(4 * 0.1 / g.wall_s)
    assert g.save_cost_s == pytest.approx(0.1)
