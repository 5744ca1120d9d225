"""One attempt of the tiny HF Trainer job reporting to TensorBoard, W&B and MLflow, run by
test_hf_loggers as its own process, alone or on 2 ranks under torchrun.

``hf_logger_worker.py RUN_DIR OUT_DIR STEPS [KILL_AT] [--signal-at N] [--tag T]``: resumes
from ``ckptdash.resume_path``, saves every 5 steps; with KILL_AT, rank 0 SIGKILLs the job
(``helpers.kill_job``: after a 0.3 s stall, so the pulses show where it got; the torchrun
agent and the other rank too) at the end of that step, no handler running;
``--signal-at N``: rank 1 alone sends itself SIGUSR2 at the end of step N (ckptdash
saves, requeues, stops); ``--tag T``: every step's log the Trainer reports holds ``tag`` =
T (which attempt logged a value). Each rank writes the step its training starts from to
``RUN_DIR.start<rank>`` and the one it ended at to ``RUN_DIR.done<rank>``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

import ckptdash
from ckptdash.hf import CkptDashCallback
from tests.frameworks.hf_tiny import SignalAt, StartedAt, trainer
from tests.train.helpers import kill_job, note_pid


class KillAt(TrainerCallback):
    def __init__(self, run_dir: Path, step: int) -> None:
        self.run_dir, self.step = run_dir, step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step and args.process_index == 0:
            kill_job(self.run_dir)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("steps", type=int)
    parser.add_argument("kill_at", type=int, nargs="?")
    parser.add_argument("--signal-at", type=int)
    parser.add_argument("--tag", type=float)
    args = parser.parse_args()
    note_pid(args.run_dir)
    callbacks: list[Any] = [
        CkptDashCallback(args.run_dir, agree_interval_s=1e-4, poll_interval_s=1e-4,
                         pulse_interval_s=0.02),
        StartedAt(args.run_dir),
    ]  # fmt: skip
    if args.signal_at is not None:
        callbacks.insert(0, SignalAt(args.signal_at))
    if args.kill_at is not None:
        callbacks.append(KillAt(args.run_dir, args.kill_at))
    report = {"report_to": ["tensorboard", "wandb", "mlflow"], "save_steps": 5}
    t = trainer(args.out_dir, steps=args.steps, callbacks=callbacks, **report)
    if args.tag is not None:
        log, tag = t.log, args.tag

        def tagged(logs: dict[str, float], *rest: Any, **kw: Any) -> None:
            step_log = "loss" in logs  # not the summary train() logs at its end
            log({**logs, "tag": tag} if step_log else logs, *rest, **kw)

        t.log = tagged  # type: ignore[method-assign]
    t.train(resume_from_checkpoint=ckptdash.resume_path(args.run_dir))
    Path(f"{args.run_dir}.done{t.args.process_index}").write_text(str(t.state.global_step))


if __name__ == "__main__":
    main()
