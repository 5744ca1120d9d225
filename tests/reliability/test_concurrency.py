"""Eight dashboards and CLIs racing commands into one running job."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.reliability import faults
from tests.reliability.conftest import scale


def test_eight_dashboards_race_commands_each_applied_once_none_lost(
    tmp_path: Path, figures: Callable[[str, str], None]
) -> None:
    """Eight processes — four running ``ckptdash save``, four calling ``control.issue`` as a
    dashboard does — issue 13 Save-now commands each (104; 8 × 125 long) at the same moment
    against one running job, while this process tails the log. Every command is received
    once and applied once, naming a checkpoint the log records; none is lost, none is left
    in the inbox or ``claimed/``, and the run's state shows each as applied."""
    report = faults.race_commands(tmp_path, issuers=8, per_issuer=scale(13, 125))
    figures("commands raced", report.summary())
    assert report.problems == [], "\n".join(report.problems[:50])
    assert report.commands == 8 * scale(13, 125) and report.applied == report.commands
