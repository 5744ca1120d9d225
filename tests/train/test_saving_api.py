"""Monitor.saving / record / record_removed: saves written by any code, directories first-class."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import ckptdash
from ckptdash import control
from ckptdash.errors import SaveError
from ckptdash.resume import choose_resume
from ckptdash.rundir import manifest
from ckptdash.state.reading import load_state

FAST = {"agree_interval_s": 1e-6, "poll_interval_s": 1e-6, "install_signals": False}


def _write_shards(folder: Path, n: int = 3, size: int = 1000) -> None:
    folder.mkdir()
    for i in range(n):
        (folder / f"shard{i}.bin").write_bytes(bytes([i]) * size)
    (folder / "optimizer.pt").write_bytes(b"o" * 500)


def _kinds(run: Path) -> list[str]:
    out = []
    for f in sorted((run / "events").iterdir()):
        out += [json.loads(line)["kind"] for line in f.read_text().splitlines()]
    return out


def test_saving_a_directory_publishes_it_with_a_manifest_and_records_it(tmp_path: Path) -> None:
    """A directory written at the handed-out path appears at the target only after the block,
    with a manifest listing every file; its saved event carries the manifest's digest, and
    the next attempt's Monitor.load() hands back that directory's path."""
    run = tmp_path / "run"
    target = run / "checkpoints" / "step=5"
    with ckptdash.Monitor(run, **FAST) as monitor:
        monitor.step(5)
        with monitor.saving(target) as tmp:
            assert tmp.parent == target.parent and not tmp.exists()
            _write_shards(tmp)
            assert not target.exists()
        assert sorted(p.name for p in target.iterdir()) == [
            manifest.MANIFEST_NAME,
            "optimizer.pt",
            "shard0.bin",
            "shard1.bin",
            "shard2.bin",
        ]
    info = load_state(run).checkpoints[str(target)]
    assert info.status == "saved" and info.step == 5 and info.trigger == "api"
    _, digest = manifest.read(target)
    assert info.checksum == digest and info.size_bytes == 3500
    assert [p.name for p in target.parent.iterdir()] == ["step=5"]  # no temp left behind
    with ckptdash.Monitor(run, **FAST) as monitor:
        assert monitor.load() == target
    assert "run_resumed" in _kinds(run)


def test_saving_a_file_replaces_the_previous_one_atomically(tmp_path: Path) -> None:
    """A single file written by any code (here safetensors-like raw bytes) is published and
    checksummed; saving the same path again replaces it, and the record follows."""
    run = tmp_path / "run"
    target = run / "checkpoints" / "model.bin"
    with ckptdash.Monitor(run, **FAST) as monitor:
        for step, payload in ((1, b"a" * 10), (2, b"b" * 20)):
            monitor.step(step)
            with monitor.saving(target) as tmp:
                tmp.write_bytes(payload)
    assert target.read_bytes() == b"b" * 20
    info = load_state(run).checkpoints[str(target)]
    assert info.step == 2 and info.size_bytes == 20 and info.checksum.startswith("xxh3_128:")
    assert choose_resume(run).path == str(target)


def test_an_exception_inside_publishes_nothing_and_records_the_failure(tmp_path: Path) -> None:
    """A writer that raises leaves the previous checkpoint of that name intact, removes its
    half-written temp directory, records checkpoint_failed, and the error reaches the caller."""
    run = tmp_path / "run"
    target = run / "checkpoints" / "step"
    with ckptdash.Monitor(run, **FAST) as monitor:
        with monitor.saving(target) as tmp:
            _write_shards(tmp)
        with pytest.raises(RuntimeError, match="disk on fire"):
            _failing_save(monitor, target)
    assert [p.name for p in target.parent.iterdir()] == ["step"]
    assert manifest.verify(target) is None
    info = load_state(run).checkpoints[str(target)]
    assert info.status == "saved" and "disk on fire" in info.error
    assert choose_resume(run).path == str(target)


def _failing_save(monitor: ckptdash.Monitor, target: Path) -> None:
    with monitor.saving(target) as tmp:
        tmp.mkdir()
        (tmp / "half.bin").write_bytes(b"x")
        raise RuntimeError("disk on fire")


def test_nothing_written_is_a_save_error(tmp_path: Path) -> None:
    """Leaving the block without writing anything at the handed-out path is an error that
    says where to write, and nothing is recorded as saved."""
    run = tmp_path / "run"
    with (
        ckptdash.Monitor(run, **FAST) as monitor,
        pytest.raises(SaveError, match="nothing was written"),
        monitor.saving(run / "x"),
    ):
        pass
    assert load_state(run).checkpoints[str(run / "x")].status == "failed"


def test_a_killed_save_leaves_a_temp_directory_the_next_attempt_removes(tmp_path: Path) -> None:
    """A process killed inside the block leaves only a temp directory next to the target;
    the next attempt deletes it and records the save as interrupted."""
    run = tmp_path / "run"
    script = textwrap.dedent(
        f"""
        import os, ckptdash
        m = ckptdash.Monitor({str(run)!r}, install_signals=False)
        with m.saving({str(run / "checkpoints" / "big")!r}) as tmp:
            tmp.mkdir()
            (tmp / "shard0.bin").write_bytes(b"x" * 4096)
            os._exit(9)
        """
    )
    done = subprocess.run([sys.executable, "-c", script], check=False, timeout=60)
    assert done.returncode == 9
    (leftover,) = (run / "checkpoints").iterdir()
    assert leftover.name.startswith(".ckptdash-tmp-big.")
    with ckptdash.Monitor(run, **FAST):
        pass
    assert list((run / "checkpoints").iterdir()) == []
    info = load_state(run).checkpoints[str(run / "checkpoints" / "big")]
    assert info.status == "failed" and "interrupted" in info.error and "4096 bytes" in info.error
    assert choose_resume(run).path is None


def test_record_and_record_removed_for_saves_written_in_place(tmp_path: Path) -> None:
    """A directory another library wrote in place is made durable, gets a manifest and is
    recorded; its removal is recorded and it stops being a resume candidate."""
    run = tmp_path / "run"
    out = tmp_path / "out"
    out.mkdir()
    with ckptdash.Monitor(run, **FAST) as monitor:
        for step in (10, 20):
            _write_shards(out / f"checkpoint-{step}")
            saved = monitor.record(out / f"checkpoint-{step}", trigger="periodic", step=step)
            assert saved is not None and saved.size_bytes == 3500
        monitor.record_removed(out / "checkpoint-10", reason="rotated")
    state = load_state(run)
    assert state.checkpoints[str(out / "checkpoint-10")].status == "removed"
    assert choose_resume(run).path == str(out / "checkpoint-20")


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: (d / "optimizer.pt").unlink(), "optimizer.pt missing"),
        (lambda d: (d / "shard1.bin").write_bytes(b"short"), "shard1.bin is 5 bytes"),
        (lambda d: (d / "shard2.bin").write_bytes(b"z" * 1000), "shard2.bin changed"),
        (lambda d: (d / ".ckptdash-tmp-x.1.ab").write_bytes(b""), ".ckptdash-tmp-x.1.ab"),
        (lambda d: (d / manifest.MANIFEST_NAME).unlink(), f"{manifest.MANIFEST_NAME} missing"),
    ],
    ids=["deleted", "resized", "changed", "temp", "no-manifest"],
)
def test_a_damaged_newest_directory_is_skipped_with_the_file_named(
    tmp_path: Path, damage: object, reason: str
) -> None:
    """A deleted, resized, rewritten or extra temp file in the newest directory checkpoint
    makes the resume rule choose the previous one, naming the file in the skip reason."""
    run = tmp_path / "run"
    with ckptdash.Monitor(run, **FAST) as monitor:
        for step in (1, 2):
            monitor.step(step)
            with monitor.saving(run / "checkpoints" / f"step={step}") as tmp:
                _write_shards(tmp)
    newest = run / "checkpoints" / "step=2"
    damage(newest)  # type: ignore[operator]
    choice = choose_resume(run)
    assert choice.path == str(run / "checkpoints" / "step=1")
    assert choice.skipped[0][0] == str(newest) and reason in choice.skipped[0][1]


def test_save_now_and_stop_are_answered_by_a_saving_block(tmp_path: Path) -> None:
    """A Save now command (a command file, as the CLI writes it) is applied by the next
    Monitor.saving() block with trigger manual; Stop after save also sets should_stop."""
    run = tmp_path / "run"
    with ckptdash.Monitor(run, **FAST) as monitor:
        monitor.step(0)
        control.issue(run, "save_now")
        decision = monitor.step(1)
        assert decision is not None and monitor.should_save
        with monitor.saving() as tmp:
            torch.save({"step": 1}, tmp)
        assert not monitor.should_save and not monitor.should_stop
        control.issue(run, "stop_after_save")
        monitor.step(2)
        monitor.record(_file(tmp_path / "elsewhere.pt"))
        assert monitor.should_stop
    state = load_state(run)
    applied = [c for c in state.commands.values() if c.status == "applied"]
    assert len(applied) == 2
    assert state.checkpoints[str(run / "checkpoints" / "step=1")].trigger == "manual"
    assert state.checkpoints[str(tmp_path / "elsewhere.pt")].trigger == "manual"


def _file(path: Path) -> Path:
    torch.save({"x": 1}, path)
    return path


def test_another_rank_failing_publishes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the agreement says another rank's writing failed, the lead rank publishes
    nothing although its own part succeeded: its temp directory is removed, the save is
    recorded as failed, and this rank gets a SaveError too (every rank leaves together)."""
    from ckptdash.train.engine import dist

    run = tmp_path / "run"
    target = run / "checkpoints" / "step=3"
    with ckptdash.Monitor(run, **FAST) as monitor:
        monitor.step(3)
        monkeypatch.setattr(dist, "agree_max", lambda values: [1] * len(values))
        with pytest.raises(SaveError, match="failed on another rank"):
            _write_dir(monitor, target)
        monkeypatch.undo()
    assert list(target.parent.iterdir()) == []
    info = load_state(run).checkpoints[str(target)]
    assert info.status == "failed" and "another rank" in info.error


def _write_dir(monitor: ckptdash.Monitor, target: Path) -> None:
    with monitor.saving(target) as tmp:
        _write_shards(tmp)
