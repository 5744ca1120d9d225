"""A plain function with ckptdash.Monitor, submitted with submitit by the SLURM tests.

Not a test module. ``train`` writes ``REPORT_DIR/attempt-<A>.json`` (A = ``SLURM_RESTART_COUNT``)
when it starts training, and returns what the finished training reached.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any


def train(run_dir: str, report_dir: str, steps: int, step_time: float = 0.03) -> dict[str, Any]:
    import torch

    import ckptdash

    torch.set_num_threads(1)
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    pause = threading.Event()
    last = -1
    with ckptdash.Monitor(run_dir, max_steps=steps, heartbeat_interval_s=0.5) as monitor:
        state = monitor.load()
        start = 0
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            start = state["step"] + 1
        Path(report_dir).mkdir(parents=True, exist_ok=True)
        report = {"attempt": attempt, "first_step": start, "pid": os.getpid()}
        (Path(report_dir) / f"attempt-{attempt}.json").write_text(json.dumps(report))
        for step in range(start, steps):
            loss = model(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            pause.wait(step_time)  # a step that takes a while: time to preempt it
            last = step
            monitor.step(step, loss=loss.item())
            if monitor.should_save:
                monitor.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step})
            if monitor.should_stop:
                break
    return {"attempt": attempt, "first_step": start, "last_step": last}
