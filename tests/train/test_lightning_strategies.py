"""Lightning strategies recognised by what they are and do, not by their names: renamed
subclasses of the shard writers are recorded as such, and a strategy of the user's own that
writes outside the CheckpointIO is recorded (or recorded as unvalidated, with a warning),
never silently missing."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.train.helpers import fake_scontrol, slurm_env, state_of

pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")
import torch
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    FSDPStrategy,
    ModelParallelStrategy,
    SingleDeviceStrategy,
)

from ckptdash.lightning.strategies import replaces_save, writes_shards
from tests.train.test_lightning import Tiny, callback, trainer


class MyFSDP(FSDPStrategy):  # type: ignore[misc]
    """A user's FSDP strategy under a name of its own."""


class MyModelParallel(ModelParallelStrategy):  # type: ignore[misc]
    """A user's ModelParallel strategy under a name of its own."""


class MyDeepSpeed(DeepSpeedStrategy):  # type: ignore[misc]
    """A user's DeepSpeed strategy under a name of its own."""


def test_renamed_subclasses_of_the_shard_writers_are_recognised() -> None:
    """A subclass of DeepSpeed, sharded FSDP or distributed-checkpoint ModelParallel writes
    shards whatever it is called; the same classes saving one file go through the IO but are
    still watched, and Lightning's own save (DDP) needs nothing."""
    assert writes_shards(MyFSDP(state_dict_type="sharded"))
    assert writes_shards(MyModelParallel(save_distributed_checkpoint=True))
    full = MyFSDP(state_dict_type="full")
    assert not writes_shards(full) and replaces_save(full)
    one_file = MyModelParallel(save_distributed_checkpoint=False)
    assert not writes_shards(one_file) and replaces_save(one_file)
    assert not writes_shards(DDPStrategy()) and not replaces_save(DDPStrategy())
    # Built without __init__, which imports DeepSpeed (~5 s): the class alone decides.
    assert writes_shards(MyDeepSpeed.__new__(MyDeepSpeed))


class DirectSave(SingleDeviceStrategy):  # type: ignore[misc]
    """Writes each checkpoint itself with ``torch.save``, never through its CheckpointIO."""

    def save_checkpoint(self, checkpoint: Any, filepath: Any, storage_options: Any = None) -> None:
        if self.is_global_zero:
            Path(filepath).parent.mkdir(parents=True, exist_ok=True)
            torch.save(checkpoint, filepath)


class FarSave(SingleDeviceStrategy):  # type: ignore[misc]
    """Writes each checkpoint into a far-away folder ckptdash cannot see."""

    far: Path

    def save_checkpoint(self, checkpoint: Any, filepath: Any, storage_options: Any = None) -> None:
        self.far.mkdir(parents=True, exist_ok=True)
        torch.save(checkpoint, self.far / f"object-{Path(filepath).name}")

    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        return super().load_checkpoint(self.far / f"object-{Path(checkpoint_path).name}")


class SuperSave(SingleDeviceStrategy):  # type: ignore[misc]
    """Overrides the save but hands it on to Lightning's own (through the CheckpointIO)."""

    def save_checkpoint(self, checkpoint: Any, filepath: Any, storage_options: Any = None) -> None:
        checkpoint["by"] = "SuperSave"
        super().save_checkpoint(checkpoint, filepath, storage_options)


@pytest.mark.parametrize("kind", ["direct", "far", "super"])
def test_a_strategy_that_saves_itself_is_recorded_and_resumed(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal save of a strategy with its own save_checkpoint is one record: validated
    where it wrote (direct, super), or unvalidated with a warning naming the strategy (far);
    the next attempt resumes from it at the next step instead of starting again at 0."""
    run = tmp_path / "run"
    fake_scontrol(tmp_path / "bin", tmp_path / "log")

    def strategy() -> Any:
        made: Any = {"direct": DirectSave, "far": FarSave, "super": SuperSave}[kind]("cpu")
        made.far = tmp_path / "far"
        return made

    slurm_env(monkeypatch, tmp_path / "bin", restart=0)
    first = Tiny(signal_at=5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(run, 20, [callback(run)], strategy=strategy()).fit(first)
    assert first.steps_run == list(range(6))
    (sig,) = [c for c in state_of(run).checkpoints.values() if c.trigger == "signal"]
    assert sig.status == "saved" and sig.step == 6
    said = [str(w.message) for w in caught if "without its CheckpointIO" in str(w.message)]
    if kind == "far":
        assert sig.unvalidated and sig.size_bytes == 0
        assert said and "FarSave" in said[0] and "recorded as unvalidated" in said[0]
    else:
        assert not sig.unvalidated and sig.checksum.startswith("xxh3_128:")
        assert sig.size_bytes == Path(sig.path).stat().st_size
        assert bool(said) == (kind == "direct")  # a save through the IO needs no warning

    slurm_env(monkeypatch, tmp_path / "bin", restart=1)
    second = Tiny()
    trainer(run, 20, [callback(run)], strategy=strategy()).fit(second)
    assert second.steps_run == list(range(6, 20))
    state = state_of(run)
    resumed = state.attempts[1].resumed_from
    assert resumed is not None and state.checkpoints[resumed].step == 6
