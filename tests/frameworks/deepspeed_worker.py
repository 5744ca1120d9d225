"""One rank of a 2-process DeepSpeed job (gloo, CPU, ``DS_ACCELERATOR=cpu``) saving through
``ckptdash.deepspeed`` (run by torchrun).

``deepspeed_worker.py RUN_DIR STAGE STEPS [--signal-at S] [--kill-in-save-at S]``: loads the
resume rule's choice with ``ckptdash.deepspeed.load_checkpoint``, trains a tiny model under
ZeRO stage STAGE, saves every 3 steps and when ckptdash asks (``keep_last=2``) with the step
and the weights' sum as client state, and writes ``RUN_DIR.rank<R>.json``: the step it
started at, the tag it loaded and whether the loaded weights agree with that save.
``--signal-at S``: rank 1 alone sends itself SIGUSR2 at step S. ``--kill-in-save-at S``: the
save at step S is SIGKILLed (the whole job) after DeepSpeed wrote it, before it is published.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path
from typing import Any

import deepspeed
import torch

import ckptdash
import ckptdash.deepspeed
from tests.train.helpers import kill_job, note_pid


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("stage", type=int)
    parser.add_argument("steps", type=int)
    parser.add_argument("--signal-at", type=int, default=-1)
    parser.add_argument("--kill-in-save-at", type=int, default=-1)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    rank = int(os.environ["RANK"])
    note_pid(args.run_dir)
    torch.manual_seed(0)
    net = torch.nn.Linear(4, 2)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": args.stage},
        "zero_allow_untested_optimizer": True,
    }
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    engine, *_ = deepspeed.initialize(model=net, optimizer=optimizer, config=config)
    report: dict[str, Any] = {"start": 0, "loaded": None}
    with ckptdash.Monitor(args.run_dir, max_steps=args.steps, agree_interval_s=0.01) as monitor:
        client = ckptdash.deepspeed.load_checkpoint(monitor, engine)
        if client is not None:
            report["loaded"] = monitor.resume_choice.path
            report["loaded_ok"] = abs(_weight_sum(engine) - client["sum"]) < 1e-6
            report["start"] = client["step"] + 1
        for step in range(report["start"], args.steps):
            loss = engine(torch.randn(2, 4)).pow(2).mean()
            engine.backward(loss)
            engine.step()
            if rank == 1 and step == args.signal_at:
                os.kill(os.getpid(), signal.SIGUSR2)
            monitor.step(step)
            if step % 3 == 2 or monitor.should_save:
                if step == args.kill_in_save_at:
                    _kill_after_writing(engine, args.run_dir)
                ckptdash.deepspeed.save_checkpoint(
                    monitor,
                    engine,
                    tag=f"step{step}",
                    client_state={"step": step, "sum": _weight_sum(engine)},
                    keep_last=2,
                )
            if monitor.should_stop:
                break
    Path(f"{args.run_dir}.rank{rank}.json").write_text(json.dumps(report))


def _weight_sum(engine: Any) -> float:
    return float(sum(p.detach().double().sum() for p in engine.module.parameters()))


def _kill_after_writing(engine: Any, run_dir: Path) -> None:
    original = engine.save_checkpoint

    def save_then_die(*args: Any, **kwargs: Any) -> Any:
        original(*args, **kwargs)
        torch.distributed.barrier()  # both ranks' shards are in the temp directory
        if int(os.environ["RANK"]) == 0:
            kill_job(run_dir)
        threading_wait_forever()

    engine.save_checkpoint = save_then_die


def threading_wait_forever() -> None:
    import threading

    threading.Event().wait()


if __name__ == "__main__":
    main()
