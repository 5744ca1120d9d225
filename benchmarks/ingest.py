"""Dashboard-side ingest: initial load of a 1 M-event log, and the cost of a small update.

(a) Initial load: ``RunTailer(run).batches()`` applied to a ``RunState`` (what
``resume`` and the dashboard do) against plain ``json.loads`` of every line of
the same file (parse only, no state). Goal: at least 1 M events/s.

(b) Incremental update: ``poll()`` + ``apply()`` of 100 events appended to the
1 M-event log against the same on an empty log. The cost should not depend on
how much was read before (ratio about 1).

The log is one rank-0 event file in the writer's layout and name: a
``run_started``, then heartbeats with metrics and a ``checkpoint_saved`` every
1000 events. Lines are encoded with the same msgspec encoder ``events.encode``
uses, without its per-event validation round trip (a few checked lines prove
the bytes are identical).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
from timing import Row, interleave, median, paired, spread

from ckptdash import events
from ckptdash.rundir import RunDir
from ckptdash.state import RunState
from ckptdash.tail import RunTailer

T0 = 1_764_430_000.0
RUN_ID = "3f2a9b8c7d6e"
HOST = "node17"
APPEND = 100
_encoder = msgspec.json.Encoder()


def _event(i: int) -> events.Event:
    """Event number ``i`` of the synthetic log (0 is run_started)."""
    t = T0 + i * 0.01
    if i == 0:
        return events.RunStarted(t=t, run=RUN_ID, attempt=0, host=HOST, pid=1, max_steps=10**7)
    if i % 1000 == 999:
        return events.CheckpointSaved(
            t=t,
            run=RUN_ID,
            attempt=0,
            host=HOST,
            step=i,
            path=f"checkpoints/step={i}.ckpt",
            trigger="periodic",
            size_bytes=52_428_800,
            duration_s=0.4,
            checksum="xxh3_128:0123456789abcdef0123456789abcdef",
        )
    return events.Heartbeat(
        t=t,
        run=RUN_ID,
        attempt=0,
        host=HOST,
        step=i,
        epoch=i // 5000,
        metrics=events.encode_metrics({"loss": 1.0 / (i + 1), "lr": 1e-3, "grad_norm": 0.5}),
        time_left_s=3600.0 - i * 1e-3,
    )


def _lines(first: int, count: int, chunk: int = 50_000) -> Iterator[bytes]:
    """Encoded events ``first .. first+count-1``, ``chunk`` events per bytes object."""
    for start in range(first, first + count, chunk):
        stop = min(start + chunk, first + count)
        yield _encoder.encode_lines([_event(i) for i in range(start, stop)])


def make_run(root: Path, n: int) -> Path:
    """A run directory with one event file of ``n`` events; returns the event file."""
    run = RunDir(root)
    root.mkdir(parents=True, exist_ok=True)
    run.run_file.write_bytes(b'{"v":1,"run_id":"%s","created_at":0}\n' % RUN_ID.encode())
    run.ensure()  # keeps that run.json: the events' run id, so their checkpoints count
    path = run.events / run.event_file_name(0, 0, HOST)
    with open(path, "wb") as f:
        for blob in _lines(0, n):
            f.write(blob)
    # The bytes must be exactly what the writer would have written.
    with open(path, "rb") as f:
        for i, line in zip(range(min(n, 1000)), f, strict=False):
            if i in (0, 1, 999) and line != events.encode(_event(i)):
                raise AssertionError(f"line {i + 1} differs from events.encode()")
    return path


def _load_ckptdash(root: Path, n: int) -> float:
    start = time.perf_counter()
    tailer, state = RunTailer(root), RunState(str(root))
    for batch in tailer.batches():
        state.apply(batch)
    elapsed = time.perf_counter() - start
    if state.events_total != n or state.bad_lines.counts:
        raise AssertionError(f"loaded {state.events_total} of {n}, bad {state.bad_lines.counts}")
    return elapsed


def _load_json(path: Path, n: int) -> float:
    loads, count = json.loads, 0
    start = time.perf_counter()
    with open(path, "rb") as f:
        for line in f:
            loads(line)
            count += 1
    elapsed = time.perf_counter() - start
    if count != n:
        raise AssertionError(f"parsed {count} of {n} lines")
    return elapsed


class _Live:
    """A run being appended to, with a tailer and state that have read all of it so far."""

    def __init__(self, root: Path, path: Path, n: int) -> None:
        self.path, self.next = path, n
        self.tailer, self.state = RunTailer(root), RunState(str(root))
        for batch in self.tailer.batches():
            self.state.apply(batch)

    def update(self) -> float:
        """Append 100 events (not timed), then time one poll() + apply()."""
        blob = b"".join(_lines(self.next, APPEND))
        self.next += APPEND
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, blob)
        finally:
            os.close(fd)
        start = time.perf_counter()
        batch = self.tailer.poll()
        self.state.apply(batch)
        elapsed = time.perf_counter() - start
        if len(batch.events) != APPEND:
            raise AssertionError(f"poll found {len(batch.events)} events, expected {APPEND}")
        return elapsed


def run(quick: bool) -> list[Row]:
    n = 200_000 if quick else 1_000_000
    load_reps, update_reps = (2, 60) if quick else (5, 300)
    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-ingest-") as tmp:
        big, empty = Path(tmp, "big"), Path(tmp, "empty")
        path = make_run(big, n)
        mb = path.stat().st_size / 1e6
        _load_json(path, n)  # warm up (page cache, first calls) both contenders
        _load_ckptdash(big, n)
        loads = interleave(
            {"ckptdash": lambda: _load_ckptdash(big, n), "json": lambda: _load_json(path, n)},
            load_reps,
        )
        rate = {k: n / median(v) for k, v in loads.items()}

        live_big = _Live(big, path, n)
        live_empty = _Live(empty, make_run(empty, 0), 0)
        updates = interleave({"big": live_big.update, "empty": live_empty.update}, update_reps)
    upd = {k: median(v) * 1e6 for k, v in updates.items()}
    update_ratio = paired(updates["big"], updates["empty"])
    return [
        Row(
            f"ingest: initial load, tail.batches() + RunState, {n:,} events ({mb:.0f} MB),"
            f" events/s (median of {load_reps}, {spread(loads['ckptdash'])})",
            f"{rate['ckptdash'] / 1e6:.2f} M/s",
            f"{rate['json'] / 1e6:.2f} M/s (json.loads per line, parse only)",
            paired(loads["json"], loads["ckptdash"]),  # rates: the inverse ratio of times
            "≥ 1.00 M/s",
            rate["ckptdash"] >= 1e6,
        ),
        Row(
            f"ingest: poll() + apply() of {APPEND} appended events, µs"
            f" (median of {update_reps}, {spread(updates['big'])})",
            f"{upd['big']:.0f} µs on top of {n:,}",
            f"{upd['empty']:.0f} µs on top of an empty log",
            update_ratio,
            "ratio ≈ 1 (≤ 1.25×)",
            update_ratio <= 1.25,
        ),
    ]
