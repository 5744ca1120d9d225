"""Synthetic run directories of any width and age, for the scale benchmark and its test.

:func:`write_run` writes one attempt of a job in the documented format (docs/format.md) as
today's training side would have left it: every rank pulsing at 1 Hz into its pulse record
(:mod:`ckptdash.rundir.pulses`) and once a minute into its own event file (its step
advancing) — or, with ``pulses_in_log``, every pulse in the log as ckptdash 0.1 wrote them —
rank 0 also writing a ``run_started`` first, a heartbeat every
``heartbeat_every_s`` and a checkpoint (``checkpoint_started`` + ``checkpoint_saved``, and a
small file where it says) every ``checkpoint_every_s``. The attempt is live: its last
events are stamped ``end`` (the time now by default), so no detector fires.

Lines are formatted directly as bytes (a 1,024-rank day is 88 M lines); their fields are
exactly those of :func:`ckptdash.events.encode`, only floats are written with 3 decimals.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from ckptdash.rundir import RunDir, pulses

RANKS_PER_NODE = 8
STEP_S = 0.5  # seconds per training step: steps advance on every pulse
CHECKPOINT_BYTES = 64  # each checkpoint file: its record is checked by size (no checksum)


@dataclass(frozen=True)
class Written:
    """What :func:`write_run` wrote."""

    root: Path
    ranks: int
    seconds: int
    files: int
    bytes: int
    lines: int
    checkpoints: int


def _host(rank: int) -> str:
    return f"node{rank // RANKS_PER_NODE:04d}"


def _envelope(run_id: str, rank: int) -> bytes:
    return b',"v":1,"t":%%.3f,"run":"%s","attempt":0,"rank":%d,"host":"%s","step":%%d}\n' % (
        run_id.encode(),
        rank,
        _host(rank).encode(),
    )


def _offset(rank: int) -> float:
    return (rank % 97) / 100.0


def _rank_lines(run_id: str, rank: int, t0: float, seconds: int, every: int) -> list[bytes]:
    """One pulse every ``every`` s from ``t0``; each rank a little offset from the others."""
    pulse = b'{"kind":"pulse"' + _envelope(run_id, rank)
    offset = _offset(rank)
    return [pulse % (t0 + s + offset, int((s + offset) / STEP_S)) for s in range(0, seconds, every)]


def _record(run_id: str, rank: int, t0: float, seconds: int) -> bytes:
    """The rank's pulse record after its last pulse (its step had just advanced)."""
    t = t0 + seconds - 1 + _offset(rank)
    step = int((seconds - 1 + _offset(rank)) / STEP_S)
    return pulses.encode(
        pulses.PulseRecord(run_id, 0, rank, _host(rank), 1000, t, step, t, seconds)
    )


def _rank0_lines(
    run_id: str,
    t0: float,
    seconds: int,
    *,
    world_size: int,
    checkpoints: Path,
    heartbeat_every_s: int,
    checkpoint_every_s: int,
    pulse_every_s: int,
) -> tuple[list[bytes], list[str]]:
    """Rank 0's file (run_started, pulses, heartbeats, checkpoints) and the checkpoint paths."""
    env = _envelope(run_id, 0)
    pulse = b'{"kind":"pulse"' + env
    lines = [
        b'{"kind":"run_started","scheduler":"slurm","job_id":"4242","world_size":%d,"pid":1000,'
        b'"max_steps":null,"requeue_budget":null'
        % world_size
        + env.replace(b'"step":%d', b'"step":null') % (t0 - 1.0,)
    ]
    paths: list[str] = []
    for s in range(seconds):
        t, step = t0 + s, int(s / STEP_S)
        if s % pulse_every_s == 0:
            lines.append(pulse % (t, step))
        if s % heartbeat_every_s == heartbeat_every_s - 1:
            loss = 1.0 / (step + 1)
            lines.append(
                b'{"kind":"heartbeat","epoch":0,"metrics":{"loss":%.6f,"lr":0.001},'
                b'"time_left_s":null' % loss + env % (t + 0.01, step)
            )
        if s % checkpoint_every_s == checkpoint_every_s - 1:
            path = str(checkpoints / f"step={step}.ckpt")
            paths.append(path)
            quoted = json.dumps(path).encode()
            lines.append(
                b'{"kind":"checkpoint_started","path":%s,"trigger":"periodic"' % quoted
                + env % (t + 0.02, step)
            )
            lines.append(
                b'{"kind":"checkpoint_saved","path":%s,"trigger":"periodic","size_bytes":%d,'
                b'"duration_s":0.4,"checksum":"","epoch":0,"blocking_s":null,"monitored":null'
                % (quoted, CHECKPOINT_BYTES)
                + env % (t + 0.42, step)
            )
    return lines, paths


def write_run(
    root: str | os.PathLike[str],
    *,
    ranks: int,
    seconds: int,
    end: float | None = None,
    heartbeat_every_s: int = 10,
    checkpoint_every_s: int = 300,
    run_id: str | None = None,
    pulses_in_log: bool = False,
) -> Written:
    """Write a live attempt of ``ranks`` ranks that has run for ``seconds`` until ``end``;
    ``pulses_in_log``: every pulse in the event log (ckptdash 0.1), no pulse records."""
    root = Path(root)
    rd = RunDir(root)
    run_id = run_id or f"{abs(hash((str(root), ranks, seconds))) % 16**12:012x}"
    t0 = (time.time() if end is None else end) - seconds
    root.mkdir(parents=True, exist_ok=True)
    rd.run_file.write_text(json.dumps({"v": 1, "run_id": run_id, "created_at": t0 - 5}) + "\n")
    rd.ensure()
    total_bytes = total_lines = 0
    every = 1 if pulses_in_log else int(pulses.LOG_EVERY_S)
    lines, paths = _rank0_lines(
        run_id,
        t0,
        seconds,
        world_size=ranks,
        checkpoints=(root / "checkpoints").resolve(),
        heartbeat_every_s=heartbeat_every_s,
        checkpoint_every_s=checkpoint_every_s,
        pulse_every_s=every,
    )
    if not pulses_in_log:
        (root / pulses.PULSES_DIR).mkdir(exist_ok=True)
    for rank in range(ranks):
        if rank:
            lines = _rank_lines(run_id, rank, t0, seconds, every)
        if not pulses_in_log:
            record = root / pulses.PULSES_DIR / pulses.record_name(0, rank)
            record.write_bytes(_record(run_id, rank, t0, seconds))
        blob = b"".join(lines)
        name = f"A0000.R{rank:04d}.{_host(rank)}.{1000 + rank % RANKS_PER_NODE}.jsonl"
        with open(rd.events / name, "wb") as f:
            f.write(blob)
        total_bytes += len(blob)
        total_lines += len(lines)
    ckpt_dir = root / "checkpoints"
    ckpt_dir.mkdir(exist_ok=True)
    for path in paths:
        Path(path).write_bytes(b"\0" * CHECKPOINT_BYTES)
    return Written(root, ranks, seconds, ranks, total_bytes, total_lines, len(paths))
