"""One rank of a 2-process gloo job saving with DCP through ckptdash (run by torchrun).

``dcp_worker.py RUN_DIR STEPS``: resumes with ``dcp.load`` from the resume rule's choice,
trains a tiny model, saves a DCP checkpoint every 3 steps (each rank also writes a tensor of
its own, so both ranks write shards), and writes ``RUN_DIR.rank<R>.json``: the step it
started at and whether the loaded tensors equal what that step saved.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import ckptdash
import ckptdash.dcp


def main() -> None:
    run_dir, steps = Path(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    mine = torch.zeros(3)
    report: dict[str, object] = {"start": 0, "loaded_ok": None}
    with ckptdash.Monitor(run_dir, max_steps=steps, agree_interval_s=0.01) as monitor:
        path = monitor.load()
        start = 0
        if path is not None:
            state = {"model": model.state_dict(), f"rank{rank}": mine, "step": torch.tensor(0)}
            dcp.load(state, checkpoint_id=path)
            model.load_state_dict(state["model"])
            start = int(state["step"]) + 1
            report["loaded_ok"] = bool(torch.equal(mine, torch.full((3,), float(start - 1 + rank))))
        report["start"] = start
        for step in range(start, steps):
            with torch.no_grad():
                model.weight.add_(0.01)
            mine.fill_(float(step + rank))
            monitor.step(step)
            if step % 3 == 2 or monitor.should_save:
                state = {
                    "model": model.state_dict(),
                    f"rank{rank}": mine,
                    "step": torch.tensor(step),
                }
                ckptdash.dcp.save(monitor, state, run_dir / "checkpoints" / f"step={step}")
            if monitor.should_stop:
                break
    Path(f"{run_dir}.rank{rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
