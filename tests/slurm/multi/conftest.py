"""The multi-node SLURM tier: one real 3-node cluster on this machine (start.sh BASE 3), each
slurmd in its own UTS namespace so its tasks see host names node1..node3.

Separate from the single-node cluster of tests/slurm: its own fixtures (``multi_cluster``,
``multi_scenarios``) and its own scenario mark (:func:`multi_scenario`), so the two never mix.
Where it cannot run (not root, packages missing, no ``unshare``) it skips saying how to enable
it; with CI=true it fails instead. Every selected scenario starts as soon as the cluster is
up, all at once; each test asserts on its scenario's observations.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.slurm.harness import Cluster, Driver, Scenarios, marked_drivers, start_tier

NODES = 3
NODE_CPUS = 8
MEASUREMENTS: list[tuple[str, dict[str, float]]] = []
"""(what, figures in seconds) the multi-node scenarios measured, printed at the end."""
_spans: dict[str, float] = {}


def multi_scenario(driver: Driver) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Mark a test as checking ``driver``'s scenario on the multi-node cluster."""

    def mark(test: Callable[..., None]) -> Callable[..., None]:
        test.slurm_multi_scenario = driver  # type: ignore[attr-defined]
        return test

    return mark


@pytest.fixture(scope="package")
def multi_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A running 3-node SLURM; skipped (failed in CI) where it cannot run."""
    base = tmp_path_factory.mktemp("slurm-multi")
    began = time.monotonic()
    cluster = start_tier(base, "multi-node SLURM tier", cpus=NODE_CPUS, nodes=NODES)
    try:
        yield cluster
    finally:
        cluster.stop()
        _spans["tier_s"] = time.monotonic() - began
        _spans["start_s"] = cluster.start_s


@pytest.fixture(scope="package")
def multi_scenarios(
    request: pytest.FixtureRequest,
    multi_cluster: Cluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Scenarios]:
    """Starts the scenario of every selected multi-node test now, so they run concurrently."""
    runner = Scenarios(multi_cluster, tmp_path_factory.mktemp("multi-scenarios"))
    runner.start(marked_drivers(request.session, "slurm_multi_scenario"))
    try:
        yield runner
    finally:
        # Not Scenarios.shutdown(): its ABORT would also end the single-node tier's waits.
        runner.pool.shutdown(wait=False, cancel_futures=True)


@pytest.fixture(autouse=True)
def _slurm_conf(multi_cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests here talk to the multi-node cluster (this replaces tests/slurm's fixture of the
    same name, so the single-node cluster is not started for them)."""
    monkeypatch.setenv("SLURM_CONF", str(multi_cluster.conf))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print what the multi-node scenarios measured on the real scheduler."""
    if "tier_s" not in _spans:
        return
    tr = terminalreporter
    tr.section("multi-node SLURM tier: measured on the real scheduler")
    tr.write_line(
        f"cluster start: {_spans['start_s']:.1f} s; tier wall time, start to stop:"
        f" {_spans['tier_s']:.0f} s"
    )
    for name, figures in MEASUREMENTS:
        tr.write_line(f"{name}: " + ", ".join(f"{k} {v:.1f}" for k, v in figures.items()))
