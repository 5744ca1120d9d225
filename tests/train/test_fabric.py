"""Lightning Fabric with ckptdash on real CPU training: ckptdash.fabric.FabricMonitor preempted
by SIGUSR2 and resumed in place, and the Trainer's callback refused by Fabric at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptdash.errors import WrongFrameworkError
from tests.train.helpers import fake_scontrol, slurm_env, state_of
from tests.train.test_distributed import _free_port, job_env

FABRIC_WORKER = Path(__file__).with_name("fabric_worker.py")

L = pytest.importorskip("lightning", reason="install the lightning extra: make test")

import ckptdash.fabric  # noqa: E402
from ckptdash.lightning import CkptDashCallback  # noqa: E402


def _fabric(**kw: Any) -> Any:
    fabric = L.Fabric(accelerator="cpu", devices=1, **kw)
    fabric.launch()
    return fabric


def fabric_loop(run: Path, total: int, signal_at: int | None = None) -> list[int]:
    """A Fabric loop as docs/frameworks.md writes it; returns the steps it ran."""
    torch.manual_seed(0)
    fabric = _fabric()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = fabric.setup(model, optimizer)
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "step": -1}
    ran: list[int] = []
    with ckptdash.fabric.FabricMonitor(
        fabric, run, max_steps=total, agree_interval_s=0.001, poll_interval_s=0.001
    ) as monitor:
        monitor.load(state)
        for step in range(state["step"] + 1, total):
            ran.append(step)
            if step == signal_at:
                os.kill(os.getpid(), signal.SIGUSR2)
            loss = model(torch.randn(8, 4)).pow(2).mean()
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            monitor.step(step, loss=loss.item())
            if monitor.should_save:
                state["step"] = step
                monitor.save(state)
            if monitor.should_stop:
                break
    return ran


def test_fabric_is_preempted_saved_through_fabric_and_resumed_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGUSR2 under Fabric: a signal save written by ``fabric.save`` (with ckptdash's
    metadata), a requeue, and a next attempt that ``fabric.load``s it in place, runs the
    remaining steps only, and is shown by ``ckptdash status`` as resumed from it."""
    run, log = tmp_path / "run", tmp_path / "scontrol.log"
    fake_scontrol(tmp_path / "bin", log)
    slurm_env(monkeypatch, tmp_path / "bin", restart=0)
    first = fabric_loop(run, 12, signal_at=4)
    assert first == list(range(5))
    assert log.read_text().split() == ["requeue", "4242"]
    state = state_of(run)
    (sig,) = state.valid_checkpoints()
    assert sig.trigger == "signal" and sig.step == 4 and sig.checksum.startswith("xxh3_128:")
    on_disk = torch.load(sig.path, weights_only=True)
    assert on_disk["ckptdash"]["trigger"] == "signal" and on_disk["step"] == 4

    slurm_env(monkeypatch, tmp_path / "bin", restart=1)
    second = fabric_loop(run, 12)
    assert second == list(range(5, 12))
    state = state_of(run)
    assert state.attempts[1].resumed_from == sig.path
    assert state.attempts[1].outcome == "finished"
    status = subprocess.run(
        [sys.executable, "-m", "ckptdash", "status", str(run)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    (row,) = [line for line in status.splitlines() if line.lstrip().startswith("1 ")]
    assert Path(sig.path).name in row


def test_resume_path_records_the_resume_for_a_loader_of_ones_own(tmp_path: Path) -> None:
    """``monitor.resume_path()`` hands back the validated checkpoint and records the resume
    once (``run_resumed``), for a loader that restores in place; a fresh start gives None and
    records nothing."""
    import ckptdash

    run = tmp_path / "run"
    with ckptdash.Monitor(run) as monitor:
        assert monitor.resume_path() is None
        monitor.step(3)
        saved = monitor.save({"w": torch.ones(2)})
    assert saved is not None
    with ckptdash.Monitor(run) as monitor:
        assert monitor.resume_path() == saved.path == monitor.resume_path()
    state = state_of(run)
    assert state.event_counts.get("run_resumed") == 1
    assert state.attempts[1].resumed_from == saved.path


def test_the_trainer_callback_given_to_fabric_fails_at_setup_naming_the_fabric_way(
    tmp_path: Path,
) -> None:
    """``L.Fabric(callbacks=[CkptDashCallback(run)])`` fails at ``fabric.setup`` — before any
    step, not silently at the first signal — with a message that names
    ``ckptdash.fabric.FabricMonitor``; the same on the first optimizer step when the model
    and optimizer are set up separately."""
    fabric = _fabric(callbacks=[CkptDashCallback(tmp_path / "run")])
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(WrongFrameworkError, match=r"ckptdash\.fabric\.FabricMonitor\(fabric"):
        fabric.setup(model, optimizer)

    fabric = _fabric(callbacks=[CkptDashCallback(tmp_path / "run")])
    module = fabric.setup_module(torch.nn.Linear(4, 1))
    opt = fabric.setup_optimizers(torch.optim.SGD(module.parameters(), lr=0.1))
    fabric.backward(module(torch.randn(2, 4)).sum())
    with pytest.raises(WrongFrameworkError, match="Trainer's callback"):
        opt.step()


def fabric_job(tmp_path: Path, name: str, run: Path, restart: int, *args: str) -> list[Any]:
    """One torchrun launch of ``fabric_worker.py`` on 2 ranks as SLURM attempt ``restart``;
    returns each rank's report. A hang is killed and fails the test."""
    reports = tmp_path / f"{name}-ranks"
    env = job_env(tmp_path, slurm_restart=restart)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"]
    argv += ["--master-addr=127.0.0.1", f"--master-port={_free_port()}", str(FABRIC_WORKER)]
    argv += [str(run), str(reports), *args]
    done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, timeout=180)
    output = (done.stdout + done.stderr).decode(errors="replace")[-6000:]
    assert done.returncode == 0, f"{name}: torchrun exited {done.returncode}:\n{output}"
    return [json.loads((reports / f"rank{r}.json").read_text()) for r in (0, 1)]


def test_two_fabric_ranks_agree_on_a_signal_one_rank_got_and_resume_together(
    tmp_path: Path,
) -> None:
    """Fabric DDP on 2 CPU ranks: SIGUSR2 to rank 1 alone stops both ranks after the same step
    with one signal save written through ``fabric.save`` and one requeue; the next attempt
    loads it on both ranks in place and runs only the remaining steps."""
    run = tmp_path / "run"
    first = fabric_job(tmp_path, "first", run, 0, "--steps", "40", "--signal-at", "5")
    assert first[0]["ran"] == first[1]["ran"] and first[0]["preempted"] and first[1]["preempted"]
    stopped = first[0]["ran"][-1]
    assert stopped >= 5
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    state = state_of(run)
    (sig,) = state.valid_checkpoints()
    assert sig.trigger == "signal" and sig.step == stopped
    assert [s.rank for s in state.signals] == [1]

    second = fabric_job(tmp_path, "second", run, 1, "--steps", "40")
    assert [r["resumed"] for r in second] == [stopped, stopped]
    assert second[0]["ran"] == second[1]["ran"] == list(range(stopped + 1, 40))
    state = state_of(run)
    assert state.attempts[1].resumed_from == sig.path and state.attempts[1].outcome == "finished"
