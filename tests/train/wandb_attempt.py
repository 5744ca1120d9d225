"""One attempt of a plain loop logging to W&B (offline), run by test_wandb_service.

``RUN_DIR LOGS {kill,finish}``: log steps 0-4 (or from the checkpoint on), save at step 2,
then SIGKILL itself (no ``finish``: the W&B service keeps the run open) or finish.
``--raw``: no ckptdash; ``wandb.init(id="ckptdash-fixed", resume="allow")`` as a user would.
Prints ``logged <id>`` once ``wandb.init`` returned.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import wandb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("logs", type=Path)
    parser.add_argument("end", choices=["kill", "finish"])
    parser.add_argument("--raw", action="store_true")
    args = parser.parse_args()
    if args.raw:
        run = wandb.init(project="exp", dir=str(args.logs), id="ckptdash-fixed", resume="allow")
        print(f"logged {run.id}", flush=True)
        run.log({"x": 1.0})
        if args.end == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        run.finish()
        return

    import ckptdash

    with ckptdash.Monitor(args.run_dir, max_steps=5, agree_interval_s=0.001) as monitor:
        state = monitor.load()
        start = 0 if state is None else state["step"] + 1
        run = wandb.init(project="exp", dir=str(args.logs), **monitor.loggers.wandb_init_kwargs())
        print(f"logged {run.id}", flush=True)
        for step in range(start, 5):
            run.log({"x": float(step), "step": step})
            monitor.step(step)
            if step == 2:
                monitor.save({"step": step})
        if args.end == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        run.finish()


if __name__ == "__main__":
    main()
