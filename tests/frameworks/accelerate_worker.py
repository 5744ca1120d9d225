"""One rank of a 2-process Accelerate job (gloo, CPU) saving through ckptdash (run by torchrun).

``accelerate_worker.py RUN_DIR PROJECT STEPS``: resumes with ``ckptdash.accelerate.load_state``
from the resume rule's choice, trains a tiny DDP model whose weights hold the step they were
set at, calls ``save_state`` every 3 steps (automatic naming, ``total_limit=2``) and writes
``RUN_DIR.rank<R>.json``: the world size, the step it started at, the folder it loaded and
whether the loaded weights and progress agree with the step that save was made at.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration

import ckptdash
import ckptdash.accelerate


class Progress:
    """The step of the last save, saved and loaded by Accelerate with the model."""

    def __init__(self) -> None:
        self.step = -1

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def main() -> None:
    run_dir, project, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    config = ProjectConfiguration(
        project_dir=str(project), automatic_checkpoint_naming=True, total_limit=2
    )
    acc = Accelerator(cpu=True, project_config=config)
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    model, _ = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))  # both saved
    progress = Progress()
    acc.register_for_checkpointing(progress)
    weight = acc.unwrap_model(model).weight
    report: dict[str, Any] = {"world": acc.num_processes, "start": 0, "loaded": None}
    with ckptdash.Monitor(run_dir, max_steps=steps, agree_interval_s=0.01) as monitor:
        path = ckptdash.accelerate.load_state(monitor, acc)
        if path is not None:
            report["loaded"] = path.name
            report["loaded_ok"] = bool(torch.all(weight == float(progress.step)))
        start = progress.step + 1
        report["start"] = start
        for step in range(start, steps):
            with torch.no_grad():
                weight.fill_(float(step))
            monitor.step(step)
            if step % 3 == 2 or monitor.should_save:
                progress.step = step
                ckptdash.accelerate.save_state(monitor, acc)
            if monitor.should_stop:
                break
    Path(f"{run_dir}.rank{acc.process_index}.json").write_text(json.dumps(report))
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main()
