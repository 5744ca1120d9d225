"""One attempt of the tiny HF Trainer job reporting to TensorBoard, W&B and MLflow, run by
test_hf_loggers as its own process.

``hf_logger_worker.py RUN_DIR OUT_DIR STEPS [KILL_AT]``: resumes from
``ckptdash.resume_path``, saves every 5 steps; with KILL_AT, SIGKILLs itself at the end of
that step (after a 0.3 s stall, so the pulses show where it got), no handler running.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

import ckptdash
from ckptdash.hf import CkptDashCallback
from tests.frameworks.hf_tiny import trainer


class KillAt(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            threading.Event().wait(0.3)
            os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    run_dir, out_dir, steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    callbacks: list[Any] = [
        CkptDashCallback(run_dir, agree_interval_s=1e-4, poll_interval_s=1e-4,
                         pulse_interval_s=0.02)
    ]  # fmt: skip
    if len(sys.argv) > 4:
        callbacks.append(KillAt(int(sys.argv[4])))
    report = {"report_to": ["tensorboard", "wandb", "mlflow"], "save_steps": 5}
    t = trainer(out_dir, steps=steps, callbacks=callbacks, **report)
    t.train(resume_from_checkpoint=ckptdash.resume_path(run_dir))


if __name__ == "__main__":
    main()
