"""Cost of the cross-rank agreement with 2 ranks on gloo (two local processes).

Measured in each of 2 spawned processes, taking turns in blocks:

* ``dist.agree_max`` (ckptdash's one ``all_reduce`` of four int64s, list in and out)
  against a bare ``all_reduce`` of a reused 4 × int64 tensor;
* a whole ``Session`` check on the same path (``boundary()`` when its countdown is
  at zero: retune, signals, rank 0's throttled inbox/heartbeat, the agreement).

The per-step figure is amortised at the default cadence: one check per
``agree_interval_s`` (1 s) of steps, i.e. one every 20 steps of 50 ms.
"""

from __future__ import annotations

import datetime
import json
import multiprocessing
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as torch_dist
from timing import Row, median, paired, spread

from ckptdash.train.config import TrainConfig
from ckptdash.train.engine import dist
from ckptdash.train.engine.session import Session

WORLD = 2
STEP_S = 0.050


def _per_call(fn: Callable[[], None], calls: int) -> float:
    """Median seconds per call of ``calls`` calls, each timed on its own."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return median(times)


def _worker(rank: int, tmp: str, calls: int, reps: int) -> None:
    torch.set_num_threads(1)
    torch_dist.init_process_group(
        "gloo",
        init_method=f"file://{tmp}/rendezvous",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),  # a lost rank fails the run, not hangs it
    )
    try:
        session = Session(TrainConfig(run_dir=f"{tmp}/run"))
        session.start(install_signals=False)
        tensor = torch.zeros(4, dtype=torch.int64)
        step = 0

        def bare() -> None:
            torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MAX)

        def agree() -> None:
            dist.agree_max([0, 0, 0, 1])

        def check() -> None:
            nonlocal step
            step += 1
            session._cadence.check_in(1)  # due now: boundary() runs the whole check
            session.boundary(step, 0, None)

        variants = {"agree_max": agree, "all_reduce": bare, "check": check}
        results: dict[str, list[float]] = {name: [] for name in variants}
        names = list(variants)
        for name in names:
            _per_call(variants[name], calls // 10)  # warm-up
        for rep in range(reps):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:  # both ranks share the order
                torch_dist.barrier()
                results[name].append(_per_call(variants[name], calls))
        session.close()
        if rank == 0:
            Path(tmp, "results.json").write_text(json.dumps(results))
    finally:
        torch_dist.destroy_process_group()


def run(quick: bool) -> list[Row]:
    calls, reps = (300, 3) if quick else (1000, 7)
    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-agree-") as tmp:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        ctx = multiprocessing.get_context("spawn")
        ranks = [ctx.Process(target=_worker, args=(r, tmp, calls, reps)) for r in range(WORLD)]
        for p in ranks:
            p.start()
        for p in ranks:
            p.join(timeout=300)
        if any(p.exitcode != 0 for p in ranks):
            for p in ranks:
                p.kill()
            raise RuntimeError(f"a rank failed: exit codes {[p.exitcode for p in ranks]}")
        results: dict[str, list[float]] = json.loads(Path(tmp, "results.json").read_text())
    us = {k: median(v) * 1e6 for k, v in results.items()}
    every = max(1, round(TrainConfig(run_dir=".").agree_interval_s / STEP_S))
    per_step_us = us["check"] / every
    step_us = STEP_S * 1e6
    what = f"median of {calls} calls × {reps} turns"
    return [
        Row(
            f"agreement, 2 ranks on gloo: dist.agree_max, µs/call ({what};"
            f" {spread(results['agree_max'])})",
            f"{us['agree_max']:.0f} µs",
            f"{us['all_reduce']:.0f} µs (bare all_reduce, reused 4×int64 tensor)",
            paired(results["agree_max"], results["all_reduce"]),
        ),
        Row(
            f"agreement, 2 ranks: whole Session check, µs/check ({what})",
            f"{us['check']:.0f} µs",
            f"{us['agree_max']:.0f} µs (agree_max alone)",
            paired(results["check"], results["agree_max"]),
        ),
        Row(
            f"agreement, amortised per {STEP_S * 1e3:.0f} ms step at the default cadence"
            f" (1 check per {every} steps)",
            f"{step_us + per_step_us:,.1f} µs (+{per_step_us:.1f} µs)",
            f"{step_us:,.0f} µs (step without it)",
            (step_us + per_step_us) / step_us,
        ),
    ]
