"""A Lightning user's own CheckpointIO under CkptDashCallback: one that writes somewhere else,
one that adds a key, one that writes where ckptdash cannot see — alone and inside
AsyncCheckpointIO — each preempted by SIGUSR2 and resumed, fit() never raising."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.train.helpers import fake_scontrol, slurm_env, state_of

pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")
from lightning.pytorch.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

from tests.train.test_lightning import Tiny, callback, trainer


def _in_store(path: Any) -> Path:
    return Path(path).parent / "store" / Path(path).name


class StoreIO(TorchCheckpointIO):  # type: ignore[misc]
    """Keeps the real files in a ``store/`` subfolder next to the path it is given."""

    def save_checkpoint(self, checkpoint: Any, path: Any, storage_options: Any = None) -> None:
        super().save_checkpoint(checkpoint, _in_store(path), storage_options)

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        return super().load_checkpoint(_in_store(path), *args, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        super().remove_checkpoint(_in_store(path))


class MetaIO(TorchCheckpointIO):  # type: ignore[misc]
    """Adds a key of its own to every checkpoint and writes it where it was told."""

    def save_checkpoint(self, checkpoint: Any, path: Any, storage_options: Any = None) -> None:
        super().save_checkpoint({**checkpoint, "written_by": "MetaIO"}, path, storage_options)


class BucketIO(TorchCheckpointIO):  # type: ignore[misc]
    """Writes into a far-away folder (an object store, another mount) under a name of its own."""

    bucket: Path

    def _key(self, path: Any) -> Path:
        return self.bucket / f"object-{abs(hash(str(path)))}"

    def save_checkpoint(self, checkpoint: Any, path: Any, storage_options: Any = None) -> None:
        super().save_checkpoint(checkpoint, self._key(path), storage_options)

    def load_checkpoint(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        return super().load_checkpoint(self._key(path), *args, **kwargs)

    def remove_checkpoint(self, path: Any) -> None:
        super().remove_checkpoint(self._key(path))


def _plugin(kind: str, tmp_path: Path) -> Any:
    name, _, wrapped = kind.partition("+")
    io: Any = {"store": StoreIO, "meta": MetaIO, "bucket": BucketIO}[name]()
    if name == "bucket":
        io.bucket = tmp_path / "bucket"
    return AsyncCheckpointIO(io) if wrapped else io


@pytest.mark.parametrize("kind", ["store", "meta", "store+async", "meta+async", "bucket"])
def test_a_users_checkpoint_io_is_preempted_and_resumed(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal save goes through the user's plugin and is recorded where the plugin really
    put it (checksummed there), or — if ckptdash cannot see it — as unvalidated with a warning;
    the next attempt resumes from it through the same plugin, at the next step."""
    run = tmp_path / "run"
    fake_scontrol(tmp_path / "bin", tmp_path / "log")
    slurm_env(monkeypatch, tmp_path / "bin", restart=0)
    first = Tiny(signal_at=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(run, 20, [callback(run)], plugins=[_plugin(kind, tmp_path)]).fit(first)
    assert first.steps_run == list(range(6))
    state = state_of(run)
    (sig,) = [c for c in state.checkpoints.values() if c.trigger == "signal"]
    assert sig.status == "saved"
    assert Path(sig.path).name == "step=6-signal.ckpt"  # the path the plugin was handed
    unvalidated = [str(w.message) for w in caught if "recorded as unvalidated" in str(w.message)]
    if kind.startswith("bucket"):
        assert sig.unvalidated and sig.size_bytes == 0 and sig.checksum == ""
        assert unvalidated and "BucketIO" in unvalidated[0]
        status = subprocess.run(
            [sys.executable, "-m", "ckptdash", "status", str(run)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        (row,) = [line for line in status.splitlines() if "step=6-signal.ckpt" in line]
        assert "saved (unvalidated)" in row
    else:
        real = _in_store(sig.path) if kind.startswith("store") else Path(sig.path)
        assert (sig.written_at or sig.path) == str(real)
        assert sig.size_bytes == real.stat().st_size
        assert sig.checksum.startswith("xxh3_128:")
        assert not unvalidated
    if kind.startswith("meta"):
        import torch

        assert torch.load(sig.path, weights_only=False)["written_by"] == "MetaIO"

    slurm_env(monkeypatch, tmp_path / "bin", restart=1)
    second = Tiny()
    t = trainer(run, 20, [callback(run)], plugins=[_plugin(kind, tmp_path)])
    t.fit(second)
    assert second.steps_run == list(range(6, 20))
    assert t.global_step == 20
    state = state_of(run)
    resumed = state.attempts[1].resumed_from
    assert resumed is not None
    assert state.checkpoints[resumed].step == 6  # the signal save, or the epoch-end one with it
    assert bool(state.checkpoints[resumed].unvalidated) == bool(sig.unvalidated)
    assert state.attempts[1].outcome == "finished"


class ReportingBucketIO(BucketIO):
    """A far-away writer that tells ckptdash where each checkpoint really went."""

    def ckptdash_written_path(self, path: Any) -> Path:
        return self._key(path)


def test_a_checkpoint_io_that_reports_its_real_path_is_validated_there(tmp_path: Path) -> None:
    """A plugin with a ``ckptdash_written_path(path)`` method has its saves fsynced, sized and
    checksummed at the path it reports, however far from the path it was handed."""
    run = tmp_path / "run"
    io = ReportingBucketIO()
    io.bucket = tmp_path / "bucket"
    t = trainer(run, 4, [callback(run)], plugins=[io])
    t.fit(Tiny())
    t.save_checkpoint(run / "by-hand.ckpt")
    info = state_of(run).checkpoints[str(run / "by-hand.ckpt")]
    assert info.written_at == str(io._key(run / "by-hand.ckpt"))
    assert info.size_bytes == Path(info.written_at).stat().st_size
    assert info.checksum.startswith("xxh3_128:") and not info.unvalidated
