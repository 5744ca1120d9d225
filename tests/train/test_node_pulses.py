"""One shared pulse file per node (ckptdash.train.health.node_pulses): the node's local rank 0
writes every rank's record; a rank that sees no collector writes its own; the folder in node memory
is never another user's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptdash.rundir import RunDir
from ckptdash.rundir.pulses import PULSES_DIR
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.reading import load_state
from ckptdash.train.health.node_pulses import NodePulses, local_rank, node_folder


def writers(run: Path, ranks: int) -> list[EventWriter]:
    return [EventWriter(RunDir(run), attempt=0, rank=r, host="node1") for r in range(ranks)]


def test_a_node_of_four_ranks_writes_one_shared_file(tmp_path: Path) -> None:
    """Local ranks 1-3 write into node memory and local rank 0 copies them with its own into
    pulses/A0000.N0000.json: one shared file (one write a second for the node), and every
    reader sees all four ranks at their steps."""
    run, shm = tmp_path / "run", tmp_path / "shm"
    shm.mkdir()
    ws = writers(run, 4)
    sinks = [NodePulses(w, local=w.rank, node_base=shm) for w in ws]
    assert [s.role for s in sinks] == ["collector", "member", "member", "member"]
    t = 1_796_000_000.0
    sinks[0].write(t=t, step=10, since=t)  # the collector marks itself first
    for s in sinks[1:]:
        s.write(t=t + 0.1, step=10 + s._writer.rank, since=t)
    sinks[0].write(t=t + 1, step=11, since=t + 1)
    assert sorted(p.name for p in (run / PULSES_DIR).iterdir()) == ["A0000.N0000.json"]
    ranks = load_state(run).rank_info(0)
    assert [(r.rank, r.step) for r in ranks] == [(0, 11), (1, 11), (2, 12), (3, 13)]
    for s in sinks:
        s.close()
    assert not any(shm.iterdir())  # the last rank to stop removed the node folder
    for w in ws:
        w.close()


def test_a_rank_without_a_collector_writes_its_own_record(tmp_path: Path) -> None:
    """Local rank 1 whose local rank 0 never pulses (another container's /dev/shm, a launcher
    without local ranks): it writes its own shared record, and stops once a collector runs."""
    run, shm = tmp_path / "run", tmp_path / "shm"
    shm.mkdir()
    w0, w1 = writers(run, 2)
    member = NodePulses(w1, local=1, node_base=shm)
    t = 1_796_000_000.0
    member.write(t=t, step=5, since=t)
    own = run / PULSES_DIR / "A0000.R0001.json"
    assert own.exists()
    assert [(r.rank, r.step) for r in load_state(run).rank_info(0)] == [(1, 5)]
    collector = NodePulses(w0, local=0, node_base=shm)
    collector.write(t=t + 1, step=6, since=t + 1)
    before = own.read_bytes()
    member.write(t=t + 1.5, step=6, since=t + 1.5)  # the collector is fresh: not written
    assert own.read_bytes() == before
    collector.write(t=t + 2, step=7, since=t + 2)
    assert [(r.rank, r.step) for r in load_state(run).rank_info(0)] == [(0, 7), (1, 6)]
    for s in (member, collector):
        s.close()
    w0.close()
    w1.close()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to plant another user's folder")
def test_a_node_folder_planted_by_another_user_is_never_used(tmp_path: Path) -> None:
    """Another account made the node folder first (in a shared /tmp): ckptdash does not write
    through it; the rank writes its own shared record instead."""
    run, shm = tmp_path / "run", tmp_path / "shm"
    shm.mkdir(mode=0o1777)
    (w,) = writers(run, 1)
    folder = shm / f"ckptdash-{os.getuid()}-{w.run_id}"
    folder.mkdir()
    os.chown(folder, 65534, 65534)
    assert node_folder(w.run_id, shm) is None
    sink = NodePulses(w, local=1, node_base=shm)
    assert sink.role == "rank"
    sink.write(t=1_796_000_000.0, step=1, since=1_796_000_000.0)
    assert (run / PULSES_DIR / "A0000.R0000.json").exists() and not any(folder.iterdir())
    sink.close()
    w.close()


def test_local_rank_comes_from_the_launcher() -> None:
    """torchrun/Accelerate/Lightning say LOCAL_RANK, srun SLURM_LOCALID; nothing: None."""
    assert local_rank({"LOCAL_RANK": "3"}) == 3
    assert local_rank({"SLURM_LOCALID": "1"}) == 1
    assert local_rank({"LOCAL_RANK": "x"}) is None and local_rank({}) is None
