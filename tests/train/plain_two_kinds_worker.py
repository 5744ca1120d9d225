"""A plain-PyTorch loop that saves both kinds of checkpoint, run by ``test_two_kinds``.

Every 4 steps its full state (``{"model", "opt", "step"}``: resumes training), every 3 steps
the model's ``state_dict()`` alone for evaluation (an artifact), and on a signal both.
``--kill-at N``: SIGKILL itself at step N, no handler runs. Prints the first step it ran.
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch

import ckptdash


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--kill-at", type=int, default=-1)
    parser.add_argument("--signal-at", type=int, default=-1)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ckptdash.Monitor(args.run, max_steps=args.steps, pulse_interval_s=0) as monitor:
        state = monitor.load()
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["step"] + 1
        print(f"first step {start}", flush=True)
        for step in range(start, args.steps):
            if step == args.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if step == args.signal_at:
                os.kill(os.getpid(), signal.SIGUSR2)
            loss = (model(torch.randn(8, 4)) ** 2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            monitor.step(step, loss=loss.item())
            full = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
            if monitor.should_save or step % 4 == 3:
                monitor.save(full)
            if monitor.should_stop or step % 3 == 2:
                monitor.save(model.state_dict(), args.run / "eval" / f"model-{step}.pt")
            if monitor.should_stop:
                break


if __name__ == "__main__":
    main()
