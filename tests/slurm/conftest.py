"""The SLURM tier: one real single-node SLURM for all of tests/slurm (tests/slurm/start.sh).

It is started once, with its state under the session's temporary folder, and always stopped
when the tier's last test is done — passed or not — by tests/slurm/stop.sh, which cancels the
cluster's jobs and stops the daemons by their pid files. Where it cannot run (not root,
packages missing) the tier skips, saying how to enable it; with CI=true it fails instead: CI
runs every tier.

Every selected scenario starts as soon as the cluster is up, all at the same time (see
``harness.Scenarios``); each test then asserts on its scenario's observations.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.slurm.harness import (
    DURATIONS,
    MEASUREMENTS,
    Cluster,
    Scenarios,
    marked_drivers,
    start_tier,
)

NODE_CPUS = 16  # more than the machine's cores: the scenarios' mostly idle jobs run at once
_started: dict[str, float] = {}


@pytest.fixture(scope="package")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running single-node SLURM; skipped (failed in CI) where the daemons cannot run."""
    base = tmp_path_factory.mktemp("slurm")  # short enough for munged's socket path
    _started["t"] = time.monotonic()
    cluster = start_tier(base, "SLURM tier", cpus=NODE_CPUS)
    _started["start_s"] = cluster.start_s
    try:
        yield cluster
    finally:
        cluster.stop()
        _started["tier_s"] = time.monotonic() - _started["t"]


@pytest.fixture(scope="package")
def scenarios(
    request: pytest.FixtureRequest, slurm_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Scenarios]:
    """Starts the scenario of every selected test now, so their jobs run concurrently."""
    runner = Scenarios(slurm_cluster, tmp_path_factory.mktemp("scenarios"))
    runner.start(marked_drivers(request.session, "slurm_scenario"))
    try:
        yield runner
    finally:
        runner.shutdown()


@pytest.fixture(autouse=True)
def _slurm_conf(slurm_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests of this tier talk to the test cluster (only they: other tiers never see it)."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster.conf))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what the tier measured on the real scheduler (docs/slurm.md quotes these)."""
    if "start_s" not in _started:
        return
    tr = terminalreporter
    tr.section("SLURM tier: measured on the real scheduler")
    if "start_s" in _started:
        tr.write_line(f"cluster start: {_started['start_s']:.1f} s")
    if "tier_s" in _started:
        tr.write_line(f"tier wall time, cluster start to stop: {_started['tier_s']:.0f} s")
    if DURATIONS:
        spans = ", ".join(f"{name} {s:.0f} s" for name, s in sorted(DURATIONS.items()))
        tr.write_line(f"scenarios (run concurrently): {spans}")
    for name, figures in MEASUREMENTS:
        text = ", ".join(
            f"{k} {v * 1000:.0f} ms" if v < 1 else f"{k} {v:.2f} s" for k, v in figures.items()
        )
        tr.write_line(f"{name}: {text}")
