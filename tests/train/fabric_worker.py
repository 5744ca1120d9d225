"""One rank of a 2-process Lightning Fabric job (DDP on gloo), launched by torchrun from
test_fabric.py. Not a test module: ``python -m torch.distributed.run --nproc-per-node=2
fabric_worker.py RUN_DIR REPORT_DIR --steps N [--signal-at S]``.

The loop is the one docs/frameworks.md shows for ``ckptdash.fabric.FabricMonitor``. With
``--signal-at S`` rank 1 alone sends itself SIGUSR2 after step S. Each rank writes the steps it
ran and the step it resumed from to ``REPORT_DIR/rank<R>.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.distributed as dist

import ckptdash.fabric


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("reports", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--signal-at", type=int)
    args = parser.parse_args()
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    state: dict[str, Any] = {"model": model, "optimizer": optimizer, "step": -1}
    ran: list[int] = []
    with ckptdash.fabric.FabricMonitor(
        fabric, args.run_dir, max_steps=args.steps, agree_interval_s=0.01, pulse_interval_s=0
    ) as monitor:
        monitor.load(state)
        resumed = state["step"]
        for step in range(state["step"] + 1, args.steps):
            ran.append(step)
            loss = model(torch.randn(8, 4)).pow(2).mean()
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            if step == args.signal_at and fabric.global_rank == 1:
                os.kill(os.getpid(), signal.SIGUSR2)
            monitor.step(step, loss=loss.item())
            if monitor.should_save:
                state["step"] = step
                monitor.save(state)
            if monitor.should_stop:
                break
    args.reports.mkdir(parents=True, exist_ok=True)
    report = {"ran": ran, "resumed": resumed, "preempted": monitor.monitor.preempted}
    (args.reports / f"rank{fabric.global_rank}.json").write_text(json.dumps(report))
    # Leave the group together, as a DDP program should: without it a rank slowed by load
    # freed the DDP reducer during interpreter shutdown, where gloo's threads aborted it
    # ("terminate called without an active exception", SIGABRT; tests/train/dist_worker.py).
    del model, optimizer, state
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
