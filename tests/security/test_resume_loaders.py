"""Directory checkpoints whose loaders unpickle are resumed from only when loading cannot run
code (issue 22, point 4): DCP's ``.metadata`` and non-tensor values are checked with
restricted loaders; any other directory must be written by the job's user alone."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptdash
import ckptdash.dcp
from ckptdash.resume import choose_resume
from ckptdash.rundir import load_safety

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

FAST = {"agree_interval_s": 1e-4, "poll_interval_s": 1e-4, "install_signals": False}


class _Boom:
    """Unpickling this runs code: the marker file appears."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def _good_run(run: Path) -> Path:
    """One real DCP save at step 2, with tensors and plain values (BYTE_IO items)."""
    with ckptdash.Monitor(run, **FAST) as monitor:
        monitor.step(2)
        state = {"w": torch.full((8,), 2.0), "step": 2, "extra": {"lr": 0.1, "name": "x"}}
        ckptdash.dcp.save(monitor, state)
    return run / "checkpoints" / "step=2"


def _plant(run: Path, fill: Any) -> Path:
    """A newer step=999999 directory, then a matching manifest and record (as a group member
    who can write the run's folders could make them)."""
    planted = run / "checkpoints" / "step=999999"
    planted.mkdir()
    fill(planted)
    with ckptdash.Monitor(run, **FAST) as monitor:
        monitor.record(planted, step=999999)
    return planted


def test_a_real_dcp_save_resumes_and_loads(tmp_path: Path) -> None:
    """A DCP save with tensors and plain values passes the restricted checks: Monitor.load()
    returns it and dcp.load restores every value."""
    good = _good_run(tmp_path / "run")
    assert load_safety.dcp_refusal(good) is None
    with ckptdash.Monitor(tmp_path / "run", **FAST) as monitor:
        path = monitor.load()
        assert path == good
        state: dict[str, Any] = {"w": torch.zeros(8), "step": 0, "extra": {"lr": 0.0, "name": ""}}
        dcp.load(state, checkpoint_id=path)
    assert torch.equal(state["w"], torch.full((8,), 2.0))
    assert state["step"] == 2
    assert state["extra"] == {"lr": 0.1, "name": "x"}


def test_a_malicious_dcp_metadata_is_skipped_and_never_runs(tmp_path: Path) -> None:
    """A recorded step=999999 whose .metadata is a pickle that would create a marker file:
    the resume rule skips it (saying its metadata needs more than DCP's classes) and
    resumes from the real save; the marker never appears, also after dcp.load of the
    choice."""
    run = tmp_path / "run"
    good = _good_run(run)
    marker = tmp_path / "pwned"
    planted = _plant(run, lambda d: (d / ".metadata").write_bytes(pickle.dumps(_Boom(marker))))
    choice = choose_resume(run)
    assert choice.path == str(good)
    reasons = dict(choice.skipped)
    assert "needs more than DCP's own classes" in reasons[str(planted)]
    assert "touch is not a class DCP writes" in reasons[str(planted)]
    with ckptdash.Monitor(run, **FAST) as monitor:
        path = monitor.load()
        assert path == good
        dcp.load({"w": torch.zeros(8), "step": 0, "extra": {}}, checkpoint_id=path)
    assert not marker.exists()


def test_a_dcp_value_that_runs_code_is_skipped(tmp_path: Path) -> None:
    """A real dcp.save whose state dict holds an object with a hostile __reduce__ (dcp.load
    hands it to torch.load(weights_only=False)): skipped, naming the value; nothing ran."""
    run = tmp_path / "run"
    good = _good_run(run)
    marker = tmp_path / "pwned"
    planted = _plant(
        run, lambda d: dcp.save({"w": torch.ones(8), "evil": _Boom(marker)}, checkpoint_id=d)
    )
    choice = choose_resume(run)
    assert choice.path == str(good)
    assert "DCP value 'evil'" in dict(choice.skipped)[str(planted)]
    assert not marker.exists()


def _torch_dir(d: Path) -> None:
    torch.save({"w": torch.ones(2)}, d / "model.bin")
    (d / "custom_checkpoint_0.pkl").write_bytes(pickle.dumps({"epoch": 1}))


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file of another uid")
def test_a_directory_with_another_accounts_file_is_skipped(tmp_path: Path) -> None:
    """An Accelerate-style directory (pickles loaded by the framework's own code) holding a
    file another account owns is skipped, naming the file and the uid."""
    run = tmp_path / "run"
    with ckptdash.Monitor(run, **FAST) as monitor:
        monitor.step(1)
        with monitor.saving(run / "checkpoints" / "checkpoint_1") as tmp:
            tmp.mkdir()
            _torch_dir(tmp)
    mine = run / "checkpoints" / "checkpoint_1"
    assert choose_resume(run).path == str(mine)

    def theirs(d: Path) -> None:
        _torch_dir(d)
        os.chown(d / "custom_checkpoint_0.pkl", 4242, 4242)

    planted = _plant(run, theirs)
    choice = choose_resume(run)
    assert choice.path == str(mine)
    why = dict(choice.skipped)[str(planted)]
    assert "custom_checkpoint_0.pkl belongs to uid 4242" in why


def test_group_writable_files_count_only_when_your_manifest_pins_them(tmp_path: Path) -> None:
    """Files saved with umask 002 (group-writable): with checksum validation the job user's
    own manifest pins their bytes, so the directory resumes; with size validation nothing
    pins them and the directory is skipped, saying how to fix it."""
    run = tmp_path / "run"
    old = os.umask(0o002)
    try:
        with ckptdash.Monitor(run, **FAST) as monitor:
            monitor.step(1)
            with monitor.saving(run / "checkpoints" / "checkpoint_1") as tmp:
                tmp.mkdir()
                _torch_dir(tmp)
    finally:
        os.umask(old)
    saved = run / "checkpoints" / "checkpoint_1"
    assert (saved / "model.bin").stat().st_mode & 0o020
    assert choose_resume(run).path == str(saved)
    sized = choose_resume(run, validate="size")
    assert sized.path is None
    assert "writable by group or others" in sized.skipped[0][1]
    assert "chmod -R go-w" in sized.skipped[0][1]


def test_the_restricted_unpickler_refuses_other_globals() -> None:
    """Only DCP's metadata classes and torch's dtypes resolve; os.system does not."""
    evil = pickle.dumps(os.system)
    with pytest.raises(pickle.UnpicklingError, match=r"(posix|os)\.system"):
        load_safety.DcpMetadataUnpickler(io.BytesIO(evil)).load()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a file of another uid")
def test_a_dcp_directory_with_another_loaders_file_is_held_to_the_owner_rule(
    tmp_path: Path,
) -> None:
    """A DCP directory with a file DCP does not write (Lightning's meta.pt, read by Lightning's
    own loader) that another account owns is skipped, though its .metadata is clean."""
    run = tmp_path / "run"
    good = _good_run(run)

    def with_meta(d: Path) -> None:
        dcp.save({"w": torch.ones(8)}, checkpoint_id=d)
        torch.save({"epoch": 1}, d / "meta.pt")
        os.chown(d / "meta.pt", 4242, 4242)

    planted = _plant(run, with_meta)
    choice = choose_resume(run)
    assert choice.path == str(good)
    assert "meta.pt belongs to uid 4242" in dict(choice.skipped)[str(planted)]
