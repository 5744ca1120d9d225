"""An Accelerate loop logging to TensorBoard through ``accelerator.log``, as docs/loggers.md
shows it (run by test_accelerate_loggers: one process on the CPU, or 2 gloo ranks under
torchrun, where Accelerate opens the tracker on the main process only).

``accelerate_logger_worker.py RUN_DIR PROJECT STEPS TAG [KILL_AT] [--signal-at N]``: resumes
with ``ckptdash.accelerate.load_state``, opens the tracker with ``monitor.loggers``' run id
and purge step, logs ``tag`` = TAG at every step, saves (``save_state``, automatic naming)
at steps 4, 9, 14, ... and when ckptdash asks; with KILL_AT, rank 0 SIGKILLs the job at that
step (``helpers.kill_job``: after a 0.3 s stall, so the pulses show where it got; the
torchrun agent and the other rank too), no handler running; ``--signal-at N``: the last rank
alone sends itself SIGUSR2 after step N (ckptdash saves, requeues, stops).
"""

from __future__ import annotations

import argparse
import os
import signal
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

import ckptdash
import ckptdash.accelerate as ca
from tests.frameworks.accelerate_worker import Progress
from tests.train.helpers import kill_job, note_pid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("project")
    parser.add_argument("steps", type=int)
    parser.add_argument("tag", type=float)
    parser.add_argument("kill_at", type=int, nargs="?", default=-1)
    parser.add_argument("--signal-at", type=int, default=-1)
    args = parser.parse_args()
    run_dir, project, steps = args.run_dir, args.project, args.steps
    note_pid(run_dir)
    config = ProjectConfiguration(project_dir=project, automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, log_with=["tensorboard"], project_config=config)
    rank, last_rank = accelerator.process_index, accelerator.num_processes - 1
    net = torch.nn.Linear(4, 1)
    model, opt = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    with ckptdash.Monitor(
        run_dir, max_steps=steps, agree_interval_s=0.001, pulse_interval_s=0.02
    ) as monitor:
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
            if rank == 0 and step == args.kill_at:
                kill_job(run_dir)
            loss = model(torch.randn(8, 4)).pow(2).mean()
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            accelerator.log({"tag": args.tag, "loss": loss.item()}, step=step)
            if rank == last_rank and step == args.signal_at:
                os.kill(os.getpid(), signal.SIGUSR2)
            monitor.step(step, loss=loss.item())
            if step % 5 == 4 or monitor.should_save:
                progress.step = step
                ca.save_state(monitor, accelerator)
            if monitor.should_stop:
                break
    accelerator.wait_for_everyone()
    accelerator.end_training()


if __name__ == "__main__":
    main()
