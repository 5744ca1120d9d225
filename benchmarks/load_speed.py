"""Initial-load speed of the dashboard side: RunTailer + RunState on a big event log.

    python benchmarks/load_speed.py [EVENTS]      # default 1,000,000

Writes one event file of EVENTS events (999 heartbeats with metrics to every
checkpoint_saved), then times a fresh tailer and state loading it three ways:
``batches()`` (the intended initial load), one ``poll()``, and the tailer alone.
The target is at least 1 M events/s for ``batches()``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from ckptdash import events
from ckptdash.rundir import RunDir
from ckptdash.state import RunState
from ckptdash.tail import RunTailer

T0 = 1_764_430_000.0


def write_log(run: RunDir, n: int) -> Path:
    """One rank-0 event file of ``n`` events, written in bulk (no fsyncs, nothing timed)."""
    run.ensure()
    path = run.events / "A0000.R0000.node17.1.jsonl"
    lines: list[bytes] = []
    with open(path, "wb") as f:
        for i in range(n):
            t = T0 + i * 0.01
            event: events.Event
            if i % 1000 == 999:
                event = events.CheckpointSaved(
                    t=t,
                    run="3f2a9b8c7d6e",
                    attempt=0,
                    host="node17",
                    step=i,
                    path=f"checkpoints/step={i}.ckpt",
                    trigger="periodic",
                    size_bytes=52_428_800,
                    duration_s=0.4,
                    checksum="xxh3_128:0123456789abcdef0123456789abcdef",
                )
            else:
                event = events.Heartbeat(
                    t=t,
                    run="3f2a9b8c7d6e",
                    attempt=0,
                    host="node17",
                    step=i,
                    epoch=i // 5000,
                    metrics=events.encode_metrics({"loss": 1.0 / (i + 1), "lr": 1e-3}),
                    time_left_s=3600.0 - i * 1e-3,
                )
            lines.append(events.encode(event))
            if len(lines) == 100_000:
                f.write(b"".join(lines))
                lines.clear()
        f.write(b"".join(lines))
    return path


def timed(label: str, run: RunDir, how: str) -> None:
    start = time.perf_counter()
    tailer, state, n = RunTailer(run), RunState(str(run.root)), 0
    if how == "batches":
        for batch in tailer.batches():
            state.apply(batch)
    elif how == "poll":
        state.apply(tailer.poll())
    else:
        for batch in tailer.batches():
            n += len(batch.events)
    elapsed = time.perf_counter() - start
    n = n or state.events_total
    print(f"{label:<28} {n:>9} events in {elapsed:6.3f} s = {n / elapsed / 1e6:5.2f} M events/s")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-") as tmp:
        run = RunDir(tmp)
        path = write_log(run, n)
        print(f"{path.name}: {os.path.getsize(path) / 1e6:.0f} MB")
        for _ in range(3):
            timed("tail.batches() + state", run, "batches")
        timed("tail.poll() + state", run, "poll")
        timed("tail.batches() alone", run, "tail")


if __name__ == "__main__":
    main()
