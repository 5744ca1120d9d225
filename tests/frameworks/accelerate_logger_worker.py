"""An Accelerate loop logging to TensorBoard through ``accelerator.log``, as docs/loggers.md
shows it (run by test_accelerate_loggers, one process on the CPU).

``accelerate_logger_worker.py RUN_DIR PROJECT STEPS TAG [KILL_AT]``: resumes with
``ckptdash.accelerate.load_state``, opens the tracker with ``monitor.loggers``' run id and
purge step, logs ``tag`` = TAG at every step, saves (``save_state``, automatic naming) at
steps 4, 9, 14, ...; with KILL_AT, SIGKILLs itself at that step (after a 0.3 s stall, so the
pulses show where it got), no handler running.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

import ckptdash
import ckptdash.accelerate as ca


class Progress:
    """The step of the last save, saved and loaded by Accelerate with the model."""

    def __init__(self) -> None:
        self.step = -1

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def main() -> None:
    run_dir, project, steps, tag = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    kill_at = int(sys.argv[5]) if len(sys.argv) > 5 else -1
    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, log_with=["tensorboard"], project_config=config)
    net = torch.nn.Linear(4, 1)
    model, opt = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    with ckptdash.Monitor(run_dir, max_steps=steps, agree_interval_s=0.001) as monitor:
        ca.load_state(monitor, accelerator)
        runs = monitor.loggers
        accelerator.init_trackers(
            runs.run_id,  # TensorBoard: PROJECT/ckptdash-<id>
            init_kwargs={"tensorboard": {"purge_step": runs.purge_step}},
        )
        runs.attach(
            "tensorboard", runs.run_id, os.path.join(project, runs.run_id), redone="replaced"
        )
        for step in range(progress.step + 1, steps):
            if step == kill_at:
                threading.Event().wait(0.3)
                os.kill(os.getpid(), signal.SIGKILL)
            loss = model(torch.randn(8, 4)).pow(2).mean()
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            accelerator.log({"tag": float(tag), "loss": loss.item()}, step=step)
            monitor.step(step, loss=loss.item())
            if step % 5 == 4 or monitor.should_save:
                progress.step = step
                ca.save_state(monitor, accelerator)
            if monitor.should_stop:
                break
    accelerator.end_training()


if __name__ == "__main__":
    main()
