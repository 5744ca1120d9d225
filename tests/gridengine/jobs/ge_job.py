"""A tiny plain-loop training job with ckptdash.Monitor, submitted by the Grid Engine tests.

Not a test module::

    ge_job.py RUN_DIR --max-steps N [--step-time S] [--rerun-step-time S] [--stop-at K]
              [--usr1-requeue]
              [--stall-at K --stall-s S] [--ranks 2 --rank R --port P]

``--rerun-step-time S``: the step time of a rerun (``RESTARTED=1``; default ``--step-time``):
a first run long enough to outlast a late kill order, and a rerun that ends soon after.
``--stop-at K``: on the first run (``RESTARTED=0``) stop after a save at step K (the batch
script then exits 99: Grid Engine's own rerun). ``--usr1-requeue``: SIGUSR1 (the ``s_rt``
soft limit) means requeue. ``--stall-at K``: on the first run, no step for ``--stall-s``
seconds after step K, or until SIGUSR2 (a hang for ``ckptdash watch --on hung=...``).
``--ranks 2``: two processes (a parallel environment job: rank 1 is started by the batch
script through ``qrsh -inherit``) in one gloo group.
Writes ``RUN_DIR.report-<rank>.json``: the step it started from and the last step trained.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--rerun-step-time", type=float)
    p.add_argument("--stop-at", type=int, default=-1)
    p.add_argument("--usr1-requeue", action="store_true")
    p.add_argument("--ranks", type=int, default=1)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--stall-at", type=int, default=-1)
    p.add_argument("--stall-s", type=float, default=0.0)
    args = p.parse_args()

    import torch.distributed as dist

    import ckptdash

    if args.ranks > 1:
        restarted = int(os.environ.get("RESTARTED", "0") or 0)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{args.port + restarted}",
            rank=args.rank,
            world_size=args.ranks,
        )
    options = {"signals": {"SIGUSR2": "requeue", "SIGUSR1": "requeue"}} if args.usr1_requeue else {}
    report = {
        "first_step": None,
        "last_step": None,
        "restarted": os.environ.get("RESTARTED"),
        "pid": os.getpid(),
    }
    out = Path(f"{args.run_dir}.report-{args.rank}.json")
    first_run = os.environ.get("RESTARTED", "0") == "0"
    step_time = args.step_time
    if not first_run and args.rerun_step_time is not None:
        step_time = args.rerun_step_time
    pause = threading.Event()
    if args.stall_at >= 0:
        # The hang ends at Grid Engine's notify: ckptdash chains this handler after its own.
        signal.signal(signal.SIGUSR2, lambda signum, frame: pause.set())
    with ckptdash.Monitor(
        args.run_dir, max_steps=args.max_steps, agree_interval_s=0.1, **options
    ) as monitor:
        state = monitor.load()
        start = 0 if state is None else state["step"] + 1
        report["first_step"] = start
        for step in range(start, args.max_steps):
            pause.wait(step_time)
            report["last_step"] = step
            monitor.step(step, loss=1.0 / (step + 1))
            stop_here = step == args.stop_at and first_run
            if step == args.stall_at and first_run:
                pause.wait(args.stall_s)
            if monitor.should_save or stop_here:
                monitor.save({"step": step})
            out.write_text(json.dumps(report))
            if monitor.should_stop or stop_here:
                break
    out.write_text(json.dumps(report))
    if args.ranks > 1:
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
