"""One rank of a tiny 2-process gloo training job, launched by torchrun from test_distributed.py.

Not a test module: run as ``python -m torch.distributed.run --nproc-per-node=2 dist_worker.py
MODE RUN_DIR REPORT_DIR --steps N [--signal-at S] [--gate-at S] [--sharded]``. Each rank writes
what it did (first and last step, the steps it saved at, whether it stopped, what it loaded) to
``REPORT_DIR/rank<R>.json`` so the test can compare the ranks.

``--signal-at S``: rank 1 alone sends itself SIGUSR2 after step S.
``--signal-after-loop`` (monitor): rank 1 sends itself SIGUSR2 after the loop, before the
Monitor's block ends.
``--sharded`` (lightning): FSDP2 through ModelParallelStrategy, saving directories of shards.
``--deepspeed`` (lightning): ZeRO-2 through a renamed subclass of Lightning's DeepSpeedStrategy
that lifts its CUDA-only check (``DS_ACCELERATOR=cpu``), saving tag directories.
``--kill-in-save`` (lightning): the first ckptdash save is SIGKILLed, whole job, after the
strategy wrote it and before it is recorded.
``--gate-at S``: after step S rank 0 writes ``REPORT_DIR/ready`` and waits until a command is in
the run's inbox (rank 1 meanwhile waits in the next step's gradient all_reduce), so a command
issued by the test is known to arrive while both ranks train.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

STEP_TIME_S = 0.005  # each step takes a little time, so the agreement cadence means something
AGREE_INTERVAL_S = 0.05
GATE_TIMEOUT_S = 60.0


def _pause(seconds: float) -> None:
    threading.Event().wait(seconds)


def _param_sum(model: torch.nn.Module) -> float:
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def _wait_for_command(run_dir: Path, report_dir: Path) -> None:
    from ckptdash import control

    (report_dir / "ready").write_text("ready\n")
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not control.pending(run_dir):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no command arrived in {run_dir} within {GATE_TIMEOUT_S} s")
        _pause(0.002)


def _leave_group() -> None:
    """Leave the process group in step with the other rank.

    Without the barrier one rank can tear gloo down while the other still has a
    collective in flight; and a DDP model that outlives destroy_process_group()
    frees its reducer during interpreter shutdown, where gloo's worker threads
    abort the process ("terminate called without an active exception", exit -6).
    """
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def monitor_main(args: argparse.Namespace, report: dict[str, Any]) -> None:
    import ckptdash

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ckptdash.Monitor(
        args.run_dir,
        max_steps=args.steps,
        agree_interval_s=AGREE_INTERVAL_S,
        poll_interval_s=0.01,
        heartbeat_interval_s=0.1,
    ) as monitor:
        report["attempt"] = monitor.attempt
        state = monitor.load()
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["step"] + 1
            report["loaded"] = monitor.resume_choice.path
        report["start"] = start
        report["param_sum_at_start"] = _param_sum(model)  # before DDP syncs anything
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        gen = torch.Generator().manual_seed(1000 + rank)
        for step in range(start, args.steps):
            loss = ddp(torch.randn(8, 4, generator=gen)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            _pause(STEP_TIME_S)
            report["last"] = step
            if rank == 1 and step == args.signal_at:
                os.kill(os.getpid(), signal.SIGUSR2)
            if rank == 0 and step == args.gate_at:
                _wait_for_command(args.run_dir, args.report_dir)
            monitor.step(step, loss=loss.item())
            if monitor.should_save:
                report["saves"].append(step)
                monitor.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step})
            if monitor.should_stop:
                report["stopped"] = True
                break
        if rank == 1 and args.signal_after_loop:
            os.kill(os.getpid(), signal.SIGUSR2)  # training is over; the Monitor is still open
    del ddp  # before the group: see _leave_group
    _leave_group()


def _strategy(sharded: bool, deepspeed: bool = False) -> Any:
    if deepspeed:
        from tests.frameworks.deepspeed_cpu import lean_deepspeed

        lean_deepspeed()
        from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

        class CPUZeRO(DeepSpeedStrategy):  # type: ignore[misc]
            """Lightning's DeepSpeedStrategy on CPU: its set-up refuses any accelerator but
            CUDA and any device list but GPU indices; DeepSpeed itself runs on CPU
            (DS_ACCELERATOR=cpu, gloo)."""

            def setup_environment(self) -> None:
                DDPStrategy.setup_environment(self)  # the parent's, without the CUDA check

            def setup_distributed(self) -> None:
                self.set_world_ranks()  # without the GPU index check
                self._init_deepspeed_distributed()

            @property
            def root_device(self) -> torch.device:
                # DeepSpeed's engine reads its rank from the device index (None on CPU).
                return torch.device("cpu", self.local_rank)

        return CPUZeRO(stage=2, process_group_backend="gloo")
    if not sharded:
        return "ddp"
    from lightning.pytorch.strategies import ModelParallelStrategy

    # Saves a directory of per-rank shards itself (torch.distributed.checkpoint), not through
    # the CheckpointIO; runs on CPU with gloo, unlike Lightning's FSDPStrategy.
    return ModelParallelStrategy(
        data_parallel_size=2, tensor_parallel_size=1, save_distributed_checkpoint=True
    )


def _kill_after_the_strategy_wrote(trainer: Any, run_dir: Path) -> None:
    """Make the strategy's engine die (the whole job) right after its next save is written."""
    from tests.train.helpers import kill_job, note_pid

    note_pid(run_dir)
    engine = trainer.strategy.deepspeed_engine
    original = engine.save_checkpoint

    def save_then_die(*a: Any, **kw: Any) -> Any:
        original(*a, **kw)
        dist.barrier()  # both ranks' files are written
        if int(os.environ["RANK"]) == 0:
            kill_job(run_dir)
        threading.Event().wait()

    engine.save_checkpoint = save_then_die


def lightning_main(args: argparse.Namespace, report: dict[str, Any]) -> None:
    import lightning.pytorch as pl

    from ckptdash.lightning import CkptDashCallback

    rank = int(os.environ["RANK"])

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def configure_model(self) -> None:
            if args.sharded:  # FSDP2: each rank holds half of the parameters, saves its shard
                from torch.distributed.fsdp import fully_shard

                fully_shard(self.layer, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            step = self.trainer.global_step
            report.setdefault("first", step)
            report["last"] = step
            _pause(STEP_TIME_S)
            if rank == 1 and step == args.signal_at:
                os.kill(os.getpid(), signal.SIGUSR2)
            return self.layer(batch[0]).pow(2).mean()

        def train_dataloader(self) -> Any:
            data = torch.utils.data.TensorDataset(torch.randn(64, 4))
            return torch.utils.data.DataLoader(data, batch_size=4)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Recorder(pl.Callback):  # type: ignore[misc]
        """Notes on every rank the step at which the ckptdash callback saved."""

        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
            report["saves"].append(trainer.global_step)
            if args.kill_in_save:
                _kill_after_the_strategy_wrote(trainer, args.run_dir)

    callback = CkptDashCallback(
        args.run_dir, agree_interval_s=AGREE_INTERVAL_S, poll_interval_s=0.01
    )
    trainer = pl.Trainer(
        default_root_dir=args.run_dir,
        max_steps=args.steps,
        callbacks=[callback, Recorder()],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        accelerator="cpu",
        devices=2,
        strategy=_strategy(args.sharded, args.deepspeed),
    )
    trainer.fit(Tiny())
    report["start"] = 0
    report["stopped"] = trainer.global_step < args.steps
    report["global_step"] = trainer.global_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["monitor", "lightning"])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("report_dir", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--signal-at", type=int, default=-1)
    parser.add_argument("--gate-at", type=int, default=-1)
    parser.add_argument("--sharded", action="store_true", help="lightning: FSDP2 shards")
    parser.add_argument("--deepspeed", action="store_true", help="lightning: ZeRO-2 on CPU")
    parser.add_argument("--kill-in-save", action="store_true", help="lightning: die saving")
    parser.add_argument(
        "--signal-after-loop", action="store_true", help="monitor: rank 1 signals after training"
    )
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    report: dict[str, Any] = {
        "rank": rank,
        "pid": os.getpid(),
        "saves": [],
        "stopped": False,
        "loaded": None,
    }
    args.report_dir.mkdir(parents=True, exist_ok=True)
    # torchrun starts each rank in its own session: the test kills a hung rank by this pid.
    (args.report_dir / f"rank{rank}.pid").write_text(f"{os.getpid()}\n")
    (monitor_main if args.mode == "monitor" else lightning_main)(args, report)
    (args.report_dir / f"rank{rank}.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
