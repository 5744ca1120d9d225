"""A tiny plain-PyTorch training job with ckptdash.Monitor, submitted by the SLURM tests.

Not a test module. One process per task: run it as the batch step (``exec python ...``) or
under ``srun`` with ``--ntasks=2`` (then every task is one rank of a gloo process group)::

    monitor_job.py RUN_DIR REPORT_DIR --max-steps N [--step-time S] [--fast-from-attempt K]
                   [--port P] [--save-every K] [--hung-after S]
                   [--hang-at STEP --hang-rank R --hang-attempt A] [--crash]

``--fast-from-attempt K``: attempts ``>= K`` train without the per-step pause, so a job that
is preempted in its early attempts finishes in a later one. ``--port``: the rendezvous port
of a multi-task job (the attempt number is added, so a restart never waits for the old one).
``--save-every``: a save every K steps besides the ones ckptdash asks for. The health
scenarios: ``--hang-at``: on attempt A, rank R stops before the step's gradient all-reduce
and never comes back, so every other rank waits inside that collective for ever (a job hung
in a collective); ``--crash``: raise at start-up, inside the Monitor, on every attempt (a
broken configuration that a requeue wrapper restarts again and again).

Each rank of each attempt writes ``REPORT_DIR/attempt-<A>.rank-<R>.json`` when it starts
training and when it ends: its host, the step it starts from, the steps at which ckptdash
decided a save, whether it stopped and the last step it trained.
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
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--step-time", type=float, default=0.03)
    p.add_argument("--fast-from-attempt", type=int, default=-1)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--save-every", type=int, default=0)
    p.add_argument("--hung-after", type=float, default=300.0)
    p.add_argument("--hang-at", type=int, default=-1)
    p.add_argument("--hang-rank", type=int, default=1)
    p.add_argument("--hang-attempt", type=int, default=0)
    p.add_argument("--crash", action="store_true")
    args = p.parse_args()

    import ckptdash

    if args.crash:  # before importing torch: a crash loop's attempts come quickly
        with ckptdash.Monitor(args.run_dir, max_steps=args.max_steps):
            raise RuntimeError("bad configuration: no such dataset 'imagenet-22k'")

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    ntasks = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    rank = int(os.environ.get("SLURM_PROCID", "0") or 0)
    if ntasks > 1:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{args.port + attempt}",
            rank=rank,
            world_size=ntasks,
        )
    report_dir = Path(args.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    out = report_dir / f"attempt-{attempt}.rank-{rank}.json"
    report: dict[str, Any] = {
        "attempt": attempt,
        "rank": rank,
        "ntasks": os.environ.get("SLURM_NTASKS"),
        "restart_count": os.environ.get("SLURM_RESTART_COUNT"),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "host": os.uname().nodename,
        "pid": os.getpid(),
        "first_step": None,
        "last_step": None,
        "saved_at": [],
        "stopped": False,
        "loaded": None,
        "finished": False,
    }

    def write_report() -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(report))
        tmp.replace(out)

    step_time = 0.0 if 0 <= args.fast_from_attempt <= attempt else args.step_time
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
        report["ckptdash_attempt"] = monitor.attempt
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
            if step_time:
                pause.wait(step_time)
            report["last_step"] = step
            monitor.step(step, loss=loss.item())
            if monitor.should_save or (args.save_every and step % args.save_every == 0):
                report["saved_at"].append(step)
                monitor.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step})
            if monitor.should_stop:
                report["stopped"] = True
                break
        report["finished"] = report["last_step"] == args.max_steps - 1
        write_report()
    if ntasks > 1:
        # In step with the other task: one task tearing gloo down while the other still
        # has a collective in flight aborts it ("terminate called without an active
        # exception") and the job ends FAILED.
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
