"""A tiny Lightning training job with CkptDashCallback, submitted with sbatch by the SLURM tests.

Not a test module. Run as the batch step (``exec python lightning_job.py ...`` so that
``--signal=B:...`` and ``scancel --batch`` reach Python)::

    lightning_job.py RUN_DIR REPORT_DIR --max-steps N [--step-time S] [--max-attempts K]
                     [--periodic-every N] [--fast-from-attempt K] [--hold-at-step N]
                     [--linger-for-signal S]

``--fast-from-attempt K``: attempts ``>= K`` train without the per-step pause, so a job that
must still be training when it is signalled in an early attempt finishes soon after.

``--hold-at-step N``: attempts before ``--fast-from-attempt`` stop in step ``N`` until
ckptdash's handler has recorded a signal: the test's signal always comes before ``max_steps``,
however loaded the machine (a wait on an event, not on a window of time).

``--linger-for-signal S``: after ``fit()`` returned, stay up to ``S`` seconds until a signal
arrives (recorded in the report as ``late_signals``), then exit 0; exit 3 when none came.

``RUN_DIR`` may contain ``{array_task}`` (replaced by ``SLURM_ARRAY_TASK_ID``). Each attempt
writes ``REPORT_DIR/attempt-<A>.json`` (A = ``SLURM_RESTART_COUNT``) twice: when it trains its
first step (``first_step`` = the global step it starts from) and when ``fit()`` returns
(``final_step``; absent when SLURM's SIGTERM after a requeue ended the process first — the
run's events say where that attempt ended).
"""

from __future__ import annotations

import time

T_PROCESS_START = time.time()  # before the heavy imports: restart-to-resumed starts here

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir")
    p.add_argument("report_dir")
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--step-time", type=float, default=0.03)
    p.add_argument("--max-attempts", type=int, default=20)
    p.add_argument("--periodic-every", type=int, default=0)
    p.add_argument("--fast-from-attempt", type=int, default=-1)
    p.add_argument("--hold-at-step", type=int, default=-1)
    p.add_argument("--linger-for-signal", type=float, default=0.0)
    args = p.parse_args()

    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from ckptdash.lightning import CkptDashCallback

    torch.set_num_threads(1)
    task = os.environ.get("SLURM_ARRAY_TASK_ID", "")
    run_dir = Path(args.run_dir.replace("{array_task}", task))
    report_dir = Path(args.report_dir.replace("{array_task}", task))
    report_dir.mkdir(parents=True, exist_ok=True)
    attempt = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    report: dict[str, Any] = {
        "attempt": attempt,
        "restart_count": os.environ.get("SLURM_RESTART_COUNT"),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "array_task": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "ntasks": os.environ.get("SLURM_NTASKS"),
        "pid": os.getpid(),
        "t_process_start": T_PROCESS_START,
        "t_import_done": time.time(),
        "first_step": None,
        "final_step": None,
    }
    out = report_dir / f"attempt-{attempt}.json"
    step_time = 0.0 if 0 <= args.fast_from_attempt <= attempt else args.step_time

    def write_report() -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(report))
        tmp.replace(out)

    pause = threading.Event()
    hold_at = args.hold_at_step if step_time else -1

    def received() -> list[Any]:
        """What ckptdash's SIGUSR2 handler recorded (its recorder's list), [] without one."""
        import signal

        owner = getattr(signal.getsignal(signal.SIGUSR2), "__self__", None)
        return list(getattr(owner, "received", []))

    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if report["first_step"] is None:
                report["first_step"] = self.trainer.global_step
                report["t_first_step"] = time.time()
                write_report()
            if step_time:
                pause.wait(step_time)  # a step that takes a while: time to signal it
            if self.trainer.global_step == hold_at:
                report["held_at"] = hold_at
                write_report()
                while not received():  # until the test's signal is in: then the boundary acts
                    pause.wait(0.02)
            loss = self.layer(batch[0]).pow(2).mean()
            self.log("loss", loss)
            return loss

        def train_dataloader(self) -> Any:
            g = torch.Generator().manual_seed(0)
            data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g))
            return torch.utils.data.DataLoader(data, batch_size=4)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callbacks: list[Any] = [
        CkptDashCallback(run_dir, max_attempts=args.max_attempts, heartbeat_interval_s=0.5)
    ]
    if args.periodic_every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=run_dir / "periodic",
                every_n_train_steps=args.periodic_every,
                save_top_k=-1,
                filename="{step}",
            )
        )
    trainer = pl.Trainer(
        default_root_dir=run_dir,
        max_steps=args.max_steps,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=bool(args.periodic_every),
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        devices=1,
    )
    trainer.fit(Tiny())
    report["final_step"] = trainer.global_step
    report["t_end"] = time.time()
    write_report()
    if args.linger_for_signal:
        deadline = time.monotonic() + args.linger_for_signal
        report["lingering"] = True
        write_report()
        while not received() and time.monotonic() < deadline:
            pause.wait(0.02)
        report["late_signals"] = [r.name for r in received()]
        write_report()
        if not report["late_signals"]:
            raise SystemExit(3)


if __name__ == "__main__":
    main()
