"""A tiny plain-PyTorch job with ckptdash.Monitor for the health scenarios of the SLURM tier.

Not a test module. Run under ``srun`` (one rank per task, gloo) or as the batch step::

    health_job.py RUN_DIR REPORT_DIR --max-steps N [--step-time S] [--save-every K]
                  [--hang-at STEP --hang-rank R --hang-attempt A] [--crash] [--port P]
                  [--hung-after S]

``--hang-at``: on attempt A, rank R stops before the step's gradient all-reduce and never
comes back, so every other rank waits inside that collective for ever: a job hung in a
collective. ``--crash``: raise at start-up, inside the Monitor, on every attempt (a broken
configuration that a requeue wrapper restarts again and again). ``--save-every``: a save
every K steps (what the next attempt resumes from). Each rank of each attempt writes
``REPORT_DIR/attempt-<A>.rank-<R>.json`` when it trains and when it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from pathlib import Path
from typing import Any


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("report_dir")
    p.add_argument("--max-steps", type=int, default=10)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--hang-at", type=int, default=-1)
    p.add_argument("--hang-rank", type=int, default=1)
    p.add_argument("--hang-attempt", type=int, default=0)
    p.add_argument("--hung-after", type=float, default=300.0)
    p.add_argument("--crash", action="store_true")
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()

    import ckptdash

    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    ntasks = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    rank = int(os.environ.get("SLURM_PROCID", "0") or 0)
    report_dir = Path(args.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    out = report_dir / f"attempt-{attempt}.rank-{rank}.json"
    report: dict[str, Any] = {"attempt": attempt, "rank": rank, "first_step": None}
    report.update(host=os.uname().nodename, last_step=None, finished=False, loaded=None)

    def write_report() -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(report))
        tmp.replace(out)

    if args.crash:
        with ckptdash.Monitor(args.run_dir, max_steps=args.max_steps):
            write_report()
            raise RuntimeError("bad configuration: no such dataset 'imagenet-22k'")

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if ntasks > 1:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{args.port + attempt}",
            rank=rank,
            world_size=ntasks,
        )
    pause = threading.Event()  # never set: a pause, and the hang's wait for ever
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ckptdash.Monitor(
        args.run_dir,
        max_steps=args.max_steps,
        agree_interval_s=0.1,
        heartbeat_interval_s=0.5,
        hung_after_s=args.hung_after,
    ) as monitor:
        state = monitor.load()
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["step"] + 1
            report["loaded"] = monitor.resume_choice.path
        report["first_step"] = start
        write_report()
        gen = torch.Generator().manual_seed(1000 + rank)
        for step in range(start, args.max_steps):
            loss = model(torch.randn(8, 4, generator=gen)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            if step == args.hang_at and rank == args.hang_rank and attempt == args.hang_attempt:
                report["hung_at"] = step
                write_report()
                pause.wait()  # never returns: the other ranks wait in the all_reduce below
            if ntasks > 1:
                for param in model.parameters():
                    assert param.grad is not None
                    dist.all_reduce(param.grad)
                    param.grad /= ntasks
            opt.step()
            pause.wait(args.step_time)
            report["last_step"] = step
            monitor.step(step, loss=loss.item())
            periodic = args.save_every and step % args.save_every == 0
            if monitor.should_save or periodic:
                state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
                monitor.save(state)
            if monitor.should_stop:
                break
        report["finished"] = report["last_step"] == args.max_steps - 1
        write_report()
    if ntasks > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
