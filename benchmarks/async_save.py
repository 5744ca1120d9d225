"""Asynchronous saves: how long training stalls, and how fast it steps while a save persists.

A state of four float32 tensors (256 MiB and 1 GiB; 64 and 256 MiB with ``--quick``) on
``--device`` (``cpu``; ``cuda`` where there is a GPU) is saved to ``benchmarks/out/`` by:

* ``save_atomic`` — the synchronous durable save (atomic, checksummed, fsync'ed): the
  baseline, the time training stands still today;
* ``AsyncSaver.submit`` — what ``Monitor.save_async`` does: the figure is its stall, the
  time until it returns (staging into reused buffers); the persist is then waited for
  before the next save, and its call-to-durable time is reported too. Goal: ≤ 10 % of
  the synchronous save;
* for information, ``atomic_write(..., direct=True)``: the synchronous save written with
  ``O_DIRECT``, as persists write.

The first async save of a state allocates its staging buffers: its stall and the peak
resident memory it adds (÷ the state's size; goal ≤ 1.1×) are reported on their own.

Step time: a small MLP trains on the same device; its mean step time while a 256 MiB
(64 MiB quick) persist runs in the background, against the same over as long a stretch
with no save running, the variants taking turns. The ratio is baseline ÷ during
(throughput); goal ≥ 0.9. ckptdash's persist writes around the page cache (``O_DIRECT``);
the same persist written buffered (``direct_io=False``) is reported beside it, for
information. Needs a quiet machine: other processes on the cores move it more than this.

As in ``save_cost``: ``os.sync()`` before each timed save, every file deleted after it.

    .venv/bin/python benchmarks/async_save.py [--quick] [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from timing import Row, interleave, median, paired, spread, table

from ckptdash.rundir import atomic_write
from ckptdash.train.checkpoints.async_save import AsyncSaver
from ckptdash.train.checkpoints.saving import save_atomic, torch_writer

OUT = Path(__file__).resolve().parent / "out" / "async-tmp"
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _state(mib: int, device: str) -> dict[str, Any]:
    per_tensor = mib * (1 << 20) // 4 // 4
    state: dict[str, Any] = {
        f"layer{i}.weight": torch.rand(per_tensor, device=device) for i in range(4)
    }
    state["step"] = 1234
    return state


def _sync_device(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


class _PeakRss:
    """Samples this process's resident memory every millisecond while in the block."""

    def __enter__(self) -> _PeakRss:
        self.before = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


def _stall_rows(mib: int, reps: int, device: str) -> list[Row]:
    state = _state(mib, device)
    state_bytes = mib << 20
    saver = AsyncSaver()
    path = OUT / "state.ckpt"
    _sync_device(device)
    os.sync()
    with _PeakRss() as rss:  # the first save: its buffers are allocated now
        start = time.perf_counter()
        handle = saver.submit(None, state, path, trigger="api", step=0)
        first_stall = time.perf_counter() - start
        handle.result()
    path.unlink()
    extra = (rss.peak - rss.before) / state_bytes

    def sync_save() -> float:
        os.sync()
        start = time.perf_counter()
        save_atomic(None, state, path, trigger="api", step=0)
        elapsed = time.perf_counter() - start
        path.unlink()
        return elapsed

    durable: list[float] = []

    def async_save() -> float:
        os.sync()
        start = time.perf_counter()
        handle = saver.submit(None, state, path, trigger="api", step=0)
        stall = time.perf_counter() - start
        handle.result()
        durable.append(time.perf_counter() - start)
        path.unlink()
        return stall

    def direct_save() -> float:
        # For information: the synchronous save written as the persist writes (O_DIRECT).
        os.sync()
        start = time.perf_counter()
        atomic_write(path, torch_writer(state), direct=True)
        elapsed = time.perf_counter() - start
        path.unlink()
        return elapsed

    sync_save()  # warm-up: first-use costs of the synchronous path
    samples = interleave({"sync": sync_save, "async": async_save, "direct": direct_save}, reps)
    samples["durable"] = durable
    ms = {k: median(v) * 1e3 for k, v in samples.items()}
    ratio = paired(samples["async"], samples["sync"])
    size = f"{mib} MiB" if mib < 1024 else f"{mib // 1024} GiB"
    where = f"{device}, median of {reps}"
    return [
        Row(
            f"async save {size}: stall (save_async returns) vs the synchronous durable save, ms"
            f" ({where}; {spread(samples['async'])})",
            f"{ms['async']:.1f} ms",
            f"{ms['sync']:.0f} ms (save_atomic; {spread(samples['sync'])})",
            ratio,
            "≤ 0.10×",
            ratio <= 0.10,
        ),
        Row(
            f"async save {size}: call to durable (the persist included, on idle cores) vs the"
            f" synchronous durable save ({where}; {spread(samples['durable'])})",
            f"{ms['durable']:.0f} ms",
            f"{ms['sync']:.0f} ms (save_atomic)",
            paired(samples["durable"], samples["sync"]),
        ),
        Row(
            f"for information, {size}: the synchronous durable save written with O_DIRECT"
            f" (as persists write) vs buffered ({where}; {spread(samples['direct'])})",
            f"{ms['direct']:.0f} ms",
            f"{ms['sync']:.0f} ms (save_atomic)",
            paired(samples["direct"], samples["sync"]),
        ),
        Row(
            f"async save {size}: the first save's stall (allocates the staging buffers) and"
            " the peak resident memory it adds ÷ the state's size",
            f"{first_stall * 1e3:.0f} ms; +{(rss.peak - rss.before) / (1 << 20):.0f} MiB",
            f"{state_bytes >> 20} MiB state",
            extra,
            "≤ 1.1×",
            extra <= 1.1,
        ),
    ]


def _step_rows(mib: int, reps: int, device: str) -> list[Row]:
    torch.manual_seed(0)
    width = 512
    model = torch.nn.Sequential(
        *[m for _ in range(3) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(128, width, device=device)

    def step() -> float:
        start = time.perf_counter()
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        _sync_device(device)
        return time.perf_counter() - start

    state = _state(mib, device)
    savers = {"direct": AsyncSaver(), "buffered": AsyncSaver(direct_io=False)}
    path = OUT / "step.ckpt"
    for _ in range(5):
        step()
    for saver in savers.values():  # buffers allocated, first-use costs paid
        saver.submit(None, state, path, trigger="api", step=0).result()
    counts: dict[str, list[int]] = {name: [] for name in savers}
    lasted: dict[str, list[float]] = {name: [] for name in savers}
    stepped: dict[str, list[float]] = {name: [] for name in savers}  # seconds spent in steps
    windows: list[float] = [0.5]

    def idle() -> float:
        # As long as the last persist took: throughput over the same stretch of time.
        times: list[float] = []
        end = time.perf_counter() + windows[-1]
        while time.perf_counter() < end or len(times) < 10:
            times.append(step())
        return sum(times) / len(times)

    def persisting(name: str) -> Callable[[], float]:
        def run() -> float:
            os.sync()
            handle = savers[name].submit(None, state, path, trigger="api", step=0)
            began = time.perf_counter()
            times = []
            while not handle.done():
                times.append(step())
            windows.append(time.perf_counter() - began)
            lasted[name].append(windows[-1])
            handle.result()
            path.unlink()
            counts[name].append(len(times))
            stepped[name].append(sum(times))
            return sum(times) / len(times) if times else float("nan")

        return run

    samples = interleave(
        {"idle": idle, "direct": persisting("direct"), "buffered": persisting("buffered")}, reps
    )
    ms = {k: median(v) * 1e3 for k, v in samples.items()}
    rows = []
    for name, how in (
        ("direct", "ckptdash's persist (O_DIRECT)"),
        ("buffered", "a buffered persist (direct_io=False)"),
    ):
        ratio = paired(samples["idle"], samples[name])
        rows.append(
            Row(
                f"training step while a {mib} MiB save persists in the background vs no save,"
                f" mean ms per step: {how} ({device}, {torch.get_num_threads()} threads,"
                f" median of {reps} persists, {min(counts[name])}–{max(counts[name])} steps"
                f" each; a persist lasted {min(lasted[name]):.1f}–{max(lasted[name]):.1f} s;"
                " ratio = throughput)",
                f"{ms[name]:.1f} ms",
                f"{ms['idle']:.1f} ms (no save running)",
                ratio,
                "≥ 0.9×" if name == "direct" else "",
                ratio >= 0.9 if name == "direct" else None,
            )
        )
    # Spread thin or taken at once, what a persist costs training in all: the extra time its
    # steps took over the same number of steps with no save running.
    idle_step = median(samples["idle"])
    lost = {
        name: median(
            [busy - n * idle_step for busy, n in zip(stepped[name], counts[name], strict=True)]
        )
        for name in savers
    }
    rows.append(
        Row(
            f"for information: training time one {mib} MiB persist costs in all (time in steps"
            " during it − as many steps with no save running), O_DIRECT vs buffered",
            f"{lost['direct']:.2f} s",
            f"{lost['buffered']:.2f} s (buffered)",
            lost["direct"] / lost["buffered"] if lost["buffered"] > 0 else None,
        )
    )
    return rows


def run(quick: bool, device: str = "cpu") -> list[Row]:
    sizes, reps = ((64, 256), 3) if quick else ((256, 1024), 5)
    OUT.mkdir(parents=True, exist_ok=True)
    rows: list[Row] = []
    try:
        for mib in sizes:
            rows.extend(_stall_rows(mib, reps, device))
        rows.extend(_step_rows(sizes[0], reps, device))
    finally:
        shutil.rmtree(OUT, ignore_errors=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    parser.add_argument("--device", default="cpu", help="where the state lives: cpu, cuda")
    args = parser.parse_args(argv)
    print(table(run(args.quick, args.device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
