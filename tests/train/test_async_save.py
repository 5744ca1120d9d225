"""Monitor.save_async and the Lightning callback's async_save: snapshot, order, durability.

The reliability tier covers kill -9 during a persist and a full disk
(tests/reliability/test_async_saves.py).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptdash
from ckptdash.events import CheckpointSaved, CheckpointStarted, RequeueIssued, decode_lines
from ckptdash.resume import check_checkpoint
from ckptdash.rundir import RunDir
from ckptdash.train.checkpoints.async_save import AsyncSaver
from tests.train.helpers import fake_scontrol, send_self, slurm_env, state_of

ROOT = Path(__file__).resolve().parents[2]


def _events(run: Path) -> list[Any]:
    out: list[Any] = []
    for path in RunDir(run).event_files():
        out.extend(decode_lines(path.read_bytes(), str(path)))
    return sorted(out, key=lambda e: e.t)


def _monitor(run: Path, **kw: Any) -> ckptdash.Monitor:
    return ckptdash.Monitor(run, install_signals=False, **kw)


def test_the_file_holds_the_state_as_it_was_at_the_call(tmp_path: Path) -> None:
    """Changing every tensor in place, and the containers, right after save_async returns
    does not reach the file: it holds the values, keys and types of the moment of the call
    (an OrderedDict state_dict with its _metadata, tied weights still one storage), and the
    saved event records the stall (blocking_s) below the whole save time (duration_s)."""
    run = tmp_path / "run"
    model = torch.nn.Linear(64, 64)
    torch.nn.init.constant_(model.weight, 1.0)
    state_dict = model.state_dict()
    bias = model.bias.detach().clone()
    state: dict[str, Any] = {
        "model": state_dict,
        "tied": [state_dict["weight"]],
        "notes": {"lr": [0.1]},
    }
    with _monitor(run) as monitor:
        monitor.step(7)
        handle = monitor.save_async(state)
        with torch.no_grad():
            model.weight.fill_(2.0)
            model.bias.zero_()
        state["notes"]["lr"].append(0.2)
        state_dict["extra"] = torch.ones(1)
        saved = handle.result(timeout=60)
    assert saved is not None and handle.done()
    loaded = torch.load(saved.path, weights_only=False)
    assert torch.equal(loaded["model"]["weight"], torch.ones(64, 64))
    assert torch.equal(loaded["model"]["bias"], bias)
    assert list(loaded["model"]) == ["weight", "bias"]
    assert isinstance(loaded["model"], OrderedDict) and hasattr(loaded["model"], "_metadata")
    assert loaded["tied"][0].untyped_storage().data_ptr() == (
        loaded["model"]["weight"].untyped_storage().data_ptr()
    )
    assert loaded["notes"] == {"lr": [0.1]}
    assert loaded["ckptdash"]["step"] == 7
    assert saved.blocking_s is not None and 0 <= saved.blocking_s <= saved.duration_s
    info = state_of(run).checkpoints[saved.path]
    assert check_checkpoint(info) is None and info.blocking_s == saved.blocking_s


def test_staging_buffers_are_reused_and_hold_one_copy_of_the_state(tmp_path: Path) -> None:
    """The second save of the same shapes allocates nothing: its tensors are copied into the
    first save's buffers. The staging memory is one copy of the state (tensors that share a
    storage are staged once), and a changed shape reallocates only that buffer."""
    saver = AsyncSaver()
    a, b = torch.rand(1 << 18), torch.rand(1 << 16)
    state = {"a": a, "a_view": a[:10], "b": b}
    state_bytes = (a.numel() + b.numel()) * 4
    saver.submit(None, state, tmp_path / "1.ckpt", trigger="api", step=1).result(timeout=60)
    (area,) = saver._areas
    assert (area.allocated_bytes, area.reused_bytes) == (state_bytes, 0)
    saver.submit(None, state, tmp_path / "2.ckpt", trigger="api", step=2).result(timeout=60)
    assert (area.allocated_bytes, area.reused_bytes) == (0, state_bytes)
    assert saver.staged_bytes == state_bytes
    state["b"] = torch.rand(1 << 15)
    saver.submit(None, state, tmp_path / "3.ckpt", trigger="api", step=3).result(timeout=60)
    assert (area.allocated_bytes, area.reused_bytes) == ((1 << 15) * 4, a.numel() * 4)
    assert torch.equal(torch.load(tmp_path / "3.ckpt")["b"], state["b"])


def test_two_quick_saves_in_a_row_persist_one_at_a_time_in_order(tmp_path: Path) -> None:
    """A second save_async right after the first waits for the first persist (one in flight):
    its checkpoint_started comes after the first's checkpoint_saved, its wait is part of its
    recorded stall, and both files are durable and valid. Two quick saves of one path leave
    the second's content, as recorded."""
    run = tmp_path / "run"
    payload = torch.zeros(8 << 20)  # 32 MiB: the first persist is still running
    with _monitor(run) as monitor:
        monitor.step(1)
        first = monitor.save_async({"p": payload, "step": 1}, run / "last.ckpt")
        payload.fill_(2.0)
        monitor.step(2)
        called = time.time()
        second = monitor.save_async({"p": payload, "step": 2}, run / "last.ckpt")
        assert first.done()  # it had to be durable before the second could stage
        payload.fill_(3.0)
        monitor.step(3)
        third = monitor.save_async({"p": payload, "step": 3})
        payload.fill_(4.0)
    assert third.done() and third.error is None  # leaving the block waited for it
    events = [e for e in _events(run) if isinstance(e, CheckpointStarted | CheckpointSaved)]
    kinds = [(e.KIND, e.step) for e in events]
    assert kinds == [
        ("checkpoint_started", 1),
        ("checkpoint_saved", 1),
        ("checkpoint_started", 2),
        ("checkpoint_saved", 2),
        ("checkpoint_started", 3),
        ("checkpoint_saved", 3),
    ]
    first_saved = first.result()
    assert first_saved is not None  # whatever of the first persist the second waited for ...
    assert second.blocking_s >= first_saved.t - called - 0.005  # ... counts in its stall
    state = state_of(run)
    last = state.checkpoints[str(run / "last.ckpt")]
    assert last.step == 2 and last.replaced == 1 and check_checkpoint(last) is None
    assert float(torch.load(run / "last.ckpt")["p"][0]) == 2.0
    assert float(torch.load(third.path)["p"][0]) == 3.0


def test_a_requeue_signal_waits_for_the_save_in_flight_before_requeueing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGUSR2 while a periodic save_async is being written: save_async writes the signal save
    right away, after the one in flight, and `scontrol requeue` runs only after both saves
    are durable and recorded; the next attempt resumes from the signal save."""
    run, log = tmp_path / "run", tmp_path / "scontrol.log"
    fake_scontrol(tmp_path / "bin", log)
    slurm_env(monkeypatch, tmp_path / "bin")
    payload = torch.zeros(8 << 20)
    with ckptdash.Monitor(run, agree_interval_s=1e-6, poll_interval_s=1e-6) as monitor:
        for step in range(50):
            payload.fill_(float(step))
            monitor.step(step)
            if monitor.should_save:
                monitor.save_async({"p": payload, "step": step})
            if monitor.should_stop:
                break
            if step == 2:
                periodic = monitor.save_async({"p": payload, "step": step}, trigger="periodic")
                send_self()
                assert not periodic.done()
    assert log.read_text().split() == ["requeue", "4242"]
    events = _events(run)
    (requeue,) = [e for e in events if isinstance(e, RequeueIssued)]
    saved = [e for e in events if isinstance(e, CheckpointSaved)]
    assert [(s.trigger, s.step) for s in saved] == [("periodic", 2), ("signal", 3)]
    assert all(s.t < requeue.t for s in saved)
    assert ckptdash.resume_path(run) == saved[-1].path


def test_sigterm_with_a_persist_in_flight_ends_with_that_save_durable(tmp_path: Path) -> None:
    """A real process gets SIGTERM while a 96 MiB background save is still being written: it
    saves at the next step boundary and exits 0, and by then the save that was in flight is
    durable, recorded, valid and holds its own step; the signal save is the resume choice."""
    run = tmp_path / "run"
    out = subprocess.run(
        [sys.executable, str(ROOT / "tests/train/async_job.py"), str(run)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    assert "in flight at signal: True" in out.stdout
    assert "stopped at step 4" in out.stdout
    state = state_of(run)
    by_trigger = {c.trigger: c for c in state.checkpoints.values()}
    assert {t: c.step for t, c in by_trigger.items()} == {"periodic": 3, "signal": 4}
    for c in by_trigger.values():
        assert check_checkpoint(c) is None and c.status == "saved"
        assert float(torch.load(c.path)["payload"][-1]) == float(c.step or 0)
    (attempt,) = state.attempts.values()
    assert (attempt.outcome, attempt.end_reason) == ("stopped", "terminated")
    assert attempt.ended_at is not None and by_trigger["periodic"].t is not None
    assert by_trigger["periodic"].t < attempt.ended_at
    assert ckptdash.resume_path(run) == by_trigger["signal"].path


L = pytest.importorskip("lightning.pytorch", reason="install the lightning extra: make test")


def test_lightning_async_save_records_every_save_durable_with_its_stall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real CPU fit with CkptDashCallback(async_save=True): ModelCheckpoint's rotating saves
    go through ckptdash's background path, each recorded with blocking_s (the signal save,
    waited for before the requeue anyway, is written directly); the on_checkpoint_saved
    hook sees each save once durable, rotation never removes a file before it is written,
    the requeue follows the durable signal save, and the next fit resumes from the newest
    save (step 10)."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from ckptdash.lightning import CkptDashCallback
    from tests.train.test_lightning import Tiny, trainer

    run, log = tmp_path / "run", tmp_path / "scontrol.log"
    fake_scontrol(tmp_path / "bin", log)
    slurm_env(monkeypatch, tmp_path / "bin")
    durable: list[CheckpointSaved] = []
    cb = CkptDashCallback(
        run,
        async_save=True,
        agree_interval_s=0.001,
        poll_interval_s=0.001,
        on_checkpoint_saved=durable.append,
    )
    mc = ModelCheckpoint(
        dirpath=run / "mc", every_n_train_steps=2, save_top_k=2, monitor="step", mode="max"
    )
    t = trainer(run, 40, [cb, mc])
    t.fit(Tiny(signal_at=9))
    assert t.global_step == 10
    assert log.read_text().split() == ["requeue", "4242"]
    state = state_of(run)
    saves = [e for e in _events(run) if isinstance(e, CheckpointSaved)]
    assert {s.trigger for s in saves} == {"periodic", "signal"}
    for s in saves:  # the signal save is waited for anyway: written directly, all stall
        background = s.trigger == "periodic"
        assert (s.blocking_s is not None) == background
        assert s.blocking_s is None or s.blocking_s <= s.duration_s
    assert sorted(e.path for e in durable) == sorted(s.path for s in saves)
    valid = state.valid_checkpoints()
    assert len([c for c in valid if c.trigger == "periodic"]) == 2  # save_top_k rotated
    assert state.event_counts.get("checkpoint_removed", 0) >= 2
    assert all(check_checkpoint(c) is None for c in valid)
    (signal_save,) = [s for s in saves if s.trigger == "signal"]
    (requeue,) = state.requeues
    assert signal_save.t < requeue.t

    newest = ckptdash.resume_path(run)  # step 10: the signal save or ModelCheckpoint's
    assert newest is not None and state.checkpoints[newest].step == signal_save.step == 10

    slurm_env(monkeypatch, tmp_path / "bin", restart=1)
    again = CkptDashCallback(run, async_save=True, agree_interval_s=0.001)
    t2 = trainer(run, 12, [again])
    t2.fit(Tiny())
    assert state_of(run).attempts[1].resumed_from == newest
