"""torch.distributed.checkpoint through ckptdash: atomic directories, recorded, resumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptdash
import ckptdash.dcp
from ckptdash.resume import choose_resume
from ckptdash.rundir import manifest
from ckptdash.state.reading import load_state
from tests.frameworks.launch import torchrun2

pytestmark = [
    pytest.mark.integration,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

FAST = {"agree_interval_s": 1e-4, "poll_interval_s": 1e-4, "install_signals": False}


def test_dcp_save_and_load_in_one_process(tmp_path: Path) -> None:
    """ckptdash.dcp.save publishes a DCP directory (.metadata and shards, plus the manifest)
    and records it; the next attempt's Monitor.load() returns its path for dcp.load; a shard
    changed on disk makes the resume rule fall back to the previous save."""
    run = tmp_path / "run"
    with ckptdash.Monitor(run, **FAST) as monitor:
        for step in (1, 2):
            monitor.step(step)
            ckptdash.dcp.save(monitor, {"w": torch.full((8,), float(step))})
    newest = run / "checkpoints" / "step=2"
    assert {".metadata", "__0_0.distcp", manifest.MANIFEST_NAME} <= {
        p.name for p in newest.iterdir()
    }
    with ckptdash.Monitor(run, **FAST) as monitor:
        path = monitor.load()
        assert path == newest
        state = {"w": torch.zeros(8)}
        dcp.load(state, checkpoint_id=path)
        assert torch.equal(state["w"], torch.full((8,), 2.0))
    shard = newest / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    choice = choose_resume(run)
    assert choice.path == str(run / "checkpoints" / "step=1")
    assert "__0_0.distcp changed" in choice.skipped[0][1]


def test_dcp_async_save_is_recorded_when_its_future_completes(tmp_path: Path) -> None:
    """dcp.async_save through ckptdash returns at once; the directory appears at its path
    and checkpoint_saved is recorded when the future completes, not before."""
    run = tmp_path / "run"
    with ckptdash.Monitor(run, **FAST) as monitor:
        monitor.step(7)
        fut = ckptdash.dcp.async_save(monitor, {"w": torch.ones(1000)})
        saved = fut.result(timeout=60)
        assert saved is not None and saved.path == str(run / "checkpoints" / "step=7")
    info = load_state(run).checkpoints[saved.path]
    assert (info.status, info.trigger, info.step) == ("saved", "periodic", 7)
    assert manifest.verify(saved.path, expected_digest=info.checksum) is None


def test_two_ranks_write_shards_into_one_published_directory(tmp_path: Path) -> None:
    """torchrun x2 (gloo): both ranks write their shards into one temp directory, rank 0
    publishes it after both finished (its manifest lists both ranks' files), and a second
    launch resumes both ranks from the newest save with dcp.load."""
    run = tmp_path / "run"
    script = Path(__file__).with_name("dcp_worker.py")
    torchrun2(tmp_path, "first", script, str(run), "6")
    state = load_state(run)
    assert sorted(Path(p).name for p in state.checkpoints) == ["step=2", "step=5"]
    files = {e.path for e in manifest.read(run / "checkpoints" / "step=5")[0].files}
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= files
    assert [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")] == []

    torchrun2(tmp_path, "resume", script, str(run), "8")
    reports = [json.loads(Path(f"{run}.rank{r}.json").read_text()) for r in (0, 1)]
    assert reports == [{"start": 6, "loaded_ok": True}] * 2
