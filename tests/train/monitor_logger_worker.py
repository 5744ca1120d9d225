"""A plain-PyTorch loop that opens its own loggers with ``monitor.loggers``, as
docs/loggers.md shows: real TensorBoard, W&B (offline) and MLflow (a local file store).

Called in-process by test_monitor_loggers (:func:`attempt`), and run as a script under
torchrun (2 gloo ranks, a DDP model) by its 2-rank test:
``monitor_logger_worker.py RUN_DIR LOGS TAG [--signal-at N] [--kill-at N]``: logs ``tag`` =
TAG at every step, saves every 5 steps; ``--signal-at N``: the last rank alone sends itself
SIGUSR2 after step N (ckptdash saves, requeues, stops); ``--kill-at N``: rank 0 SIGKILLs
the whole job at step N, without warning (``helpers.kill_job``). Every rank asks
``monitor.loggers`` for the loggers' arguments; only rank 0 opens the loggers.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
from pathlib import Path

import torch
import torch.distributed as dist

import ckptdash
from tests.train.helpers import kill_job, note_pid

STEPS = 20


class Crash(RuntimeError):
    pass


def attempt(
    run: Path,
    logs: Path,
    *,
    tag: float,
    crash_at: int = -1,
    signal_at: int = -1,
    kill_at: int = -1,
    total: int = STEPS,
) -> None:
    """One attempt of a loop that saves every 5 steps (and when ckptdash asks) and logs
    ``tag`` at every step to the three loggers; ``crash_at``: raise at that step."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ckptdash.Monitor(
        run, max_steps=total, agree_interval_s=0.001, poll_interval_s=0.01, pulse_interval_s=0.02
    ) as monitor:
        state = monitor.load()
        start = 0 if state is None else state["step"] + 1
        if state is not None:
            model.load_state_dict(state["model"])
        net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
        runs = monitor.loggers  # on every rank: only rank 0's calls record anything
        tb_kwargs = runs.tensorboard_writer_kwargs(logs / "tb")
        wb_kwargs = runs.wandb_init_kwargs()
        skip_through = runs.logged_through
        if rank == 0:  # (imported here: rank 1 does without them)
            import mlflow
            import wandb
            from torch.utils.tensorboard import SummaryWriter

            tb = SummaryWriter(**tb_kwargs)
            wb = wandb.init(project="exp", dir=str(logs), mode="offline", **wb_kwargs)
            mlflow.set_tracking_uri(f"file:{logs / 'mlruns'}")
            ml = mlflow.start_run(run_id=runs.mlflow_run_id)
            runs.attach("mlflow", ml.info.run_id, mlflow.get_tracking_uri())
        try:
            for step in range(start, total):
                if step == crash_at:
                    raise Crash(f"boom at {step}")
                if rank == 0 and step == kill_at:
                    kill_job(run)
                loss = net(torch.randn(8, 4)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                if rank == 0:
                    tb.add_scalar("tag", tag, step)
                    if skip_through is None or step > skip_through:
                        wb.log({"tag": tag, "step": step})
                        mlflow.log_metric("tag", tag, step=step)
                if rank == world - 1 and step == signal_at:
                    os.kill(os.getpid(), signal.SIGUSR2)
                monitor.step(step, loss=loss.item())
                if step % 5 == 0 or monitor.should_save:
                    monitor.save({"model": model.state_dict(), "step": step})
                if monitor.should_stop:
                    break
        finally:
            if rank == 0:
                tb.close()
                wb.finish()
                mlflow.end_run()
        del net  # before the process group goes (a DDP reducer freed later aborts gloo)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run", type=Path)
    parser.add_argument("logs", type=Path)
    parser.add_argument("tag", type=float)
    parser.add_argument("--signal-at", type=int, default=-1)
    parser.add_argument("--kill-at", type=int, default=-1)
    args = parser.parse_args()
    note_pid(args.run)
    dist.init_process_group("gloo")
    attempt(args.run, args.logs, tag=args.tag, signal_at=args.signal_at, kill_at=args.kill_at)
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
