"""A realistic run directory, written with ckptdash's own
:class:`~ckptdash.rundir.writer.EventWriter`:
for the README screenshot, the benchmarks and trying the dashboard without a cluster.

Three hours of a SLURM job ending now: attempt 0 is preempted (SIGUSR2, signal
save, requeue), attempt 1 takes a manual "Save now" and is then killed without
warning, attempt 2 resumes from the last periodic save and is training.

    python -c "from ckptdash._dev.sample import write_sample_run; write_sample_run('runs/sample')"
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

from ckptdash import events as ev
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter

CKPT_BYTES = 1_288_490_188  # 1.2 GiB, written as a sparse file (no disk used)


def write_sample_run(
    root: str | os.PathLike[str], *, now: float | None = None, heartbeat_s: float = 30.0
) -> RunDir:
    """Write the sample run into ``root`` (which must not hold a run yet); returns it."""
    now = time.time() if now is None else now
    rd = RunDir(root)
    rd.ensure()
    t0 = now - 3 * 3600
    rate = 1.6  # steps per second
    state = {"step": 0}

    def save_s(step: int) -> float:
        return 9.0 + 2.0 * math.sin(step)

    def step_at(t: float, start_t: float, start_step: int) -> int:
        return start_step + int((t - start_t) * rate)

    def ckpt(w: EventWriter, t: float, step: int, trigger: ev.Trigger, name: str) -> str:
        """Save at ``t``; durable ``save_s(step)`` seconds later."""
        path = rd.checkpoints / name
        with open(path, "wb") as f:
            f.truncate(CKPT_BYTES)
        w.emit(ev.CheckpointStarted, t=t, step=step, path=str(path), trigger=trigger)
        w.emit(
            ev.CheckpointSaved,
            t=t + save_s(step),
            step=step,
            epoch=step // 4000,
            path=str(path),
            trigger=trigger,
            size_bytes=CKPT_BYTES,
            duration_s=save_s(step),
        )
        return str(path)

    def train(
        w: EventWriter, start_t: float, end_t: float, start_step: int, limit_t: float
    ) -> str | None:
        """Heartbeats and a periodic save every 15 min; returns the last periodic path."""
        last = None
        t = start_t + heartbeat_s
        next_save = start_t + 900 - (start_t - t0) % 900
        while t < end_t:
            step = step_at(t, start_t, start_step)
            state["step"] = step
            loss = 2.5 * math.exp(-step / 6000) + 0.05 * math.sin(step / 97)
            w.emit(
                ev.Heartbeat,
                t=t,
                step=step,
                epoch=step // 4000,
                metrics={"loss": round(loss, 4), "lr": 3e-4},
                time_left_s=max(0.0, limit_t - t),
            )
            if t >= next_save:
                last = ckpt(w, t, step, "periodic", f"epoch={step // 4000}-step={step}.ckpt")
                next_save += 900
            t += heartbeat_s
        return last

    job: dict[str, Any] = {
        "scheduler": "slurm",
        "job_id": "4242",
        "world_size": 8,
        "max_steps": 20_000,
        "requeue_budget": 5,
    }
    # Attempt 0: preempted with a warning.
    a0_end = now - 2 * 3600 - 5 * 60
    with EventWriter(rd, attempt=0, host="node17") as w:
        w.emit(ev.RunStarted, t=t0, pid=4711, **job)
        train(w, t0, a0_end, 0, t0 + 4 * 3600)
        step = step_at(a0_end, t0, 0)
        w.emit(ev.SignalReceived, t=a0_end, step=step, signal="SIGUSR2", action="requeue")
        signal_path = ckpt(w, a0_end + 1.5, step, "signal", f"step={step}-signal.ckpt")
        durable = a0_end + 1.5 + save_s(step)
        w.emit(
            ev.RequeueIssued,
            t=durable + 0.3,
            step=step,
            job_id="4242",
            command="scontrol requeue 4242",
        )
        w.emit(ev.RunFinished, t=durable + 0.5, step=step, reason="preempted")
    # Attempt 1: a manual save, then killed without warning (no goodbye event).
    a1_start, a1_end = now - 1 * 3600 - 55 * 60, now - 62 * 60
    resumed = step_at(a0_end, t0, 0)
    with EventWriter(rd, attempt=1, host="node03") as w:
        w.emit(ev.RunStarted, t=a1_start, pid=912, **job)
        w.emit(
            ev.RunResumed,
            t=a1_start + 20,
            step=resumed,
            path=signal_path,
            reason="newest valid checkpoint",
        )
        last = train(w, a1_start + 20, now - 80 * 60, resumed, a1_start + 4 * 3600)
        manual_t = now - 80 * 60
        step = step_at(manual_t, a1_start + 20, resumed)
        cid = f"{int((manual_t - 4) * 1e9):020d}-5eed0001"
        # The command file as the dashboard wrote it, already answered (in done/).
        rd.done.mkdir(parents=True, exist_ok=True)
        command = ev.SaveNow(
            id=cid, t=manual_t - 4, author="alice@login1 (dashboard)", host="login1"
        )
        (rd.done / f"{cid}.json").write_bytes(ev.encode_command(command))
        w.emit(ev.CommandReceived, t=manual_t, step=step, command_id=cid, command="save_now")
        manual = ckpt(w, manual_t + 0.5, step, "manual", f"step={step}-manual.ckpt")
        w.emit(
            ev.CommandApplied,
            t=manual_t + 11,
            step=step,
            command_id=cid,
            command="save_now",
            detail=manual,
        )
        last = train(w, manual_t + 11, a1_end, step, a1_start + 4 * 3600) or last
    # Attempt 2: resumed from the last periodic save; training now.
    a2_start = now - 50 * 60
    resume_from = last or manual
    resume_step = int(Path(resume_from).stem.rsplit("=", 1)[-1].split("-")[0])
    with EventWriter(rd, attempt=2, host="node11") as w:
        w.emit(ev.RunStarted, t=a2_start, pid=5150, **job)
        w.emit(
            ev.RunResumed,
            t=a2_start + 25,
            step=resume_step,
            path=resume_from,
            reason="newest valid checkpoint",
        )
        train(w, a2_start + 25, now - 2, resume_step, a2_start + 4 * 3600)
    return rd
