"""A training job for the SIGTERM test: a background save is in flight when SIGTERM comes.

    python tests/train/async_job.py RUN_DIR

At step 3 it starts a 96 MiB save with ``save_async``, sends itself SIGTERM while that
save is still being written (printing ``in flight at signal: True``), and goes on as any
loop would: the next step boundary decides the signal save, which ends the loop. It
changes its tensor after every call, so each file must hold the step it was saved at.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

from ckptdash import Monitor


def main(run_dir: str) -> None:
    payload = torch.zeros(24 << 20)  # 96 MiB of float32: its persist takes a while
    with Monitor(run_dir, agree_interval_s=1e-6, poll_interval_s=1e-6) as monitor:
        for step in range(100):
            payload.fill_(float(step))
            monitor.step(step)
            if monitor.should_save:
                monitor.save_async({"payload": payload, "step": step})
            if monitor.should_stop:
                print(f"stopped at step {step}", flush=True)
                break
            if step == 3:
                handle = monitor.save_async({"payload": payload, "step": step}, trigger="periodic")
                os.kill(os.getpid(), signal.SIGTERM)  # recorded by ckptdash's handler
                print(f"in flight at signal: {not handle.done()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
