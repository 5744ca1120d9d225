"""One rank of a 2-process DeepSpeed job (gloo, CPU, ``DS_ACCELERATOR=cpu``) saving through
``ckptdash.deepspeed`` (run by torchrun), for one or more runs one after the other.

``deepspeed_worker.py STEPS RUN_DIR:STAGE[:EVENT] ...``: for each run in turn, a tiny model
under ZeRO stage STAGE loads the resume rule's choice with ``ckptdash.deepspeed.load_checkpoint``,
trains up to step STEPS, saves every 3 steps and when ckptdash asks (``keep_last=2``) with the
step and the weights' sum as client state, and writes ``RUN_DIR.rank<R>.json``: the step it
started at, the tag it loaded and whether the loaded weights agree with that save. EVENT:
``signal@S``: rank 1 alone sends itself SIGUSR2 at step S; ``kill@S``: the save at step S is
SIGKILLed (the whole job) after DeepSpeed wrote it, before it is published, so the runs after
it in the list never start.

Several runs share one launch because a launch costs ~10 s of start-up a rank (torch,
DeepSpeed, torch's compiler stack imported by the first optimizer), the runs nothing.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from tests.frameworks.deepspeed_cpu import lean_deepspeed

lean_deepspeed()

import deepspeed  # noqa: E402
import torch  # noqa: E402

import ckptdash  # noqa: E402
import ckptdash.deepspeed  # noqa: E402
from tests.train.helpers import kill_job, note_pid  # noqa: E402


def main() -> None:
    steps, *specs = sys.argv[1:]
    deepspeed.init_distributed(dist_backend="gloo")
    for spec in specs:
        run_dir, stage, *event = spec.split(":")
        what, _, at = (event[0] if event else "").partition("@")
        run(Path(run_dir), int(stage), int(steps), what, int(at) if at else -1)


def run(run_dir: Path, stage: int, steps: int, event: str, at: int) -> None:
    rank = int(os.environ["RANK"])
    note_pid(run_dir)
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    engine, *_ = deepspeed.initialize(model=net, optimizer=optimizer, config=config)
    report: dict[str, Any] = {"start": 0, "loaded": None}
    with ckptdash.Monitor(run_dir, max_steps=steps, agree_interval_s=0.01) as monitor:
        client = ckptdash.deepspeed.load_checkpoint(monitor, engine)
        if client is not None:
            report["loaded"] = monitor.resume_choice.path
            report["loaded_ok"] = abs(_weight_sum(engine) - client["sum"]) < 1e-6
            report["start"] = client["step"] + 1
        for step in range(report["start"], steps):
            loss = engine(torch.randn(2, 4)).pow(2).mean()
            engine.backward(loss)
            engine.step()
            if rank == 1 and event == "signal" and step == at:
                os.kill(os.getpid(), signal.SIGUSR2)
            monitor.step(step)
            if step % 3 == 2 or monitor.should_save:
                if event == "kill" and step == at:
                    _kill_after_writing(engine, run_dir)
                ckptdash.deepspeed.save_checkpoint(
                    monitor,
                    engine,
                    tag=f"step{step}",
                    client_state={"step": step, "sum": _weight_sum(engine)},
                    keep_last=2,
                )
            if monitor.should_stop:
                break
    Path(f"{run_dir}.rank{rank}.json").write_text(json.dumps(report))


def _weight_sum(engine: Any) -> float:
    return float(sum(p.detach().double().sum() for p in engine.module.parameters()))


def _kill_after_writing(engine: Any, run_dir: Path) -> None:
    original = engine.save_checkpoint

    def save_then_die(*args: Any, **kwargs: Any) -> Any:
        original(*args, **kwargs)
        torch.distributed.barrier()  # both ranks' shards are in the temp directory
        if int(os.environ["RANK"]) == 0:
            kill_job(run_dir)
        threading.Event().wait()

    engine.save_checkpoint = save_then_die


if __name__ == "__main__":
    main()
