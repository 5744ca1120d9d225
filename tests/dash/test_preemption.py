"""What preemptions cost (ckptdash.analysis.preemption) on dashboard scenarios: work lost per
preemption, saving share, preemption rate, Young/Daly interval."""

from __future__ import annotations

import math

import pytest

from ckptdash.analysis import preemption
from tests.dash.conftest import Scenario, preempted_run


def test_young_and_daly_formulas() -> None:
    """Young is sqrt(2CM); Daly adds its correction and never exceeds M."""
    assert preemption.young_interval(10, 3600) == pytest.approx(math.sqrt(72000))
    daly = preemption.daly_interval(10, 3600)
    r = 10 / 7200
    expected = math.sqrt(72000) * (1 + math.sqrt(r) / 3 + r / 9) - 10
    assert daly == pytest.approx(expected)
    assert preemption.daly_interval(8000, 3600) == 3600
    assert preemption.expected_waste(60, 1, 3600) == pytest.approx(1 / 60 + 60 / 7200)


def test_young_interval_minimises_expected_waste() -> None:
    """The first-order waste C/τ + τ/2M is smallest at Young's τ."""
    c, m = 12.0, 5400.0
    best = preemption.young_interval(c, m)
    w = preemption.expected_waste(best, c, m)
    assert w < preemption.expected_waste(best * 0.8, c, m)
    assert w < preemption.expected_waste(best * 1.25, c, m)


def test_preemptions_with_and_without_a_warning(scenario: Scenario) -> None:
    """Attempt 0 was signalled and saved (margins measured, little lost); attempt 1 was killed
    without warning and lost everything since its last periodic save."""
    scenario.add(*preempted_run())
    p0, p1 = preemption.preemptions(scenario.snapshot())
    assert (p0.attempt, p0.warned, p0.signal) == (0, True, "SIGUSR2")
    assert p0.signal_to_save_s == pytest.approx(3.0)
    assert p0.save_to_requeue_s == pytest.approx(1.0)
    assert p0.requeue_issued
    assert p0.lost_s == pytest.approx(2.0)  # saved at 253, ended at 255
    assert p0.lost_steps == 0
    assert (p1.attempt, p1.warned) == (1, False)
    assert p1.lost_s == pytest.approx(60.0)  # last save at 400, last sign of life at 460
    assert p1.lost_steps == 60


def test_goodput_figures(scenario: Scenario) -> None:
    """Saving share, preemptions per hour, save cost, the run's interval and Young/Daly."""
    scenario.add(*preempted_run())
    g = preemption.compute(scenario.snapshot())
    assert g.wall_s == pytest.approx(255 + 160 + 110)
    assert g.saves == 4
    assert g.saving_share == pytest.approx(8.0 / g.wall_s)
    assert g.per_hour == pytest.approx(2 / (g.wall_s / 3600))
    assert g.save_cost_s == pytest.approx(2.0)
    assert g.interval_s == pytest.approx(100.0)
    assert g.mtbf_s == pytest.approx(g.wall_s / 2)
    assert g.young_s == pytest.approx(math.sqrt(2 * 2.0 * g.wall_s / 2))
    assert g.daly_s is not None and g.daly_s < g.young_s
    assert g.unwarned == 1


def test_no_preemption_no_optimum(scenario: Scenario) -> None:
    """Without a preemption there is no failure rate, so no Young/Daly interval."""
    scenario.add(*preempted_run()[:4])
    g = preemption.compute(scenario.snapshot())
    assert g.preemptions == ()
    assert g.young_s is None
    assert g.waste(100.0) is None
