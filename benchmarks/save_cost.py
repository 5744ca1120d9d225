"""Checkpoint save cost: ckptdash's atomic, checksummed write against plain ``torch.save``.

A state dict of four float32 tensors (256 MiB; 64 MiB with ``--quick``) is saved to
the local disk under ``benchmarks/out/`` (not ``/tmp``, which may be tmpfs) by:

* ``torch.save(state, path)`` — the baseline;
* ``torch.save`` + ``os.fsync`` — the plain durable save;
* ``atomic_write(path, torch_writer(state), fsync=False)`` — temp file, checksum while
  writing, rename; goal ≤ 1.05× ``torch.save``;
* ``save_atomic(None, state, path, ...)`` — what ``CkptDashCallback`` does for Lightning:
  ``atomic_write`` with its default fsync of the file and of the directory;
* Lightning's default ``TorchCheckpointIO().save_checkpoint(state, path)``.

The page cache cannot be dropped; instead each save goes to a new file that is
deleted right after, ``os.sync()`` runs (untimed) before every save so no write-back
of an earlier one lands in it, and the variants take turns. Medians of 9 (3 with
``--quick``): single saves now and then take several times the median.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import xxhash
from lightning.pytorch.plugins.io import TorchCheckpointIO
from timing import Row, interleave, median, paired, spread

from ckptdash.rundir import atomic_write
from ckptdash.train.checkpoints.saving import save_atomic, torch_writer

OUT = Path(__file__).resolve().parent / "out" / "save-tmp"


def _torch_save_fsync(state: dict[str, Any], path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def _timed(save: Callable[[Path], object], name: str) -> Callable[[], float]:
    def once() -> float:
        path = OUT / f"{name}.ckpt"
        os.sync()
        time.sleep(0.05)  # let the write-back (and the discard of deleted blocks) settle
        start = time.perf_counter()
        save(path)
        elapsed = time.perf_counter() - start
        if path.stat().st_size < 1 << 20:
            raise AssertionError(f"{name} wrote only {path.stat().st_size} bytes")
        path.unlink()
        return elapsed

    return once


def _hash_s(state: dict[str, Any]) -> float:
    """Seconds to xxh3_128 the tensors' bytes in memory: what the checksum would add to a
    save if it were not overlapped with the write."""
    start = time.perf_counter()
    h = xxhash.xxh3_128()
    for value in state.values():
        if isinstance(value, torch.Tensor):
            h.update(value.numpy().data)
    h.hexdigest()
    return time.perf_counter() - start


def run(quick: bool) -> list[Row]:
    mib, reps = (64, 3) if quick else (256, 9)
    per_tensor = mib * (1 << 20) // 4 // 4  # four float32 tensors
    torch.manual_seed(0)
    state: dict[str, Any] = {f"layer{i}.weight": torch.rand(per_tensor) for i in range(4)}
    state["step"] = 1234
    OUT.mkdir(parents=True, exist_ok=True)
    lightning_io = TorchCheckpointIO()
    variants: dict[str, Callable[[Path], object]] = {
        "torch.save": lambda p: torch.save(state, p),
        "torch.save+fsync": lambda p: _torch_save_fsync(state, p),
        "atomic": lambda p: atomic_write(p, torch_writer(state), fsync=False),
        "save_atomic": lambda p: save_atomic(None, state, p, trigger="api", step=0),
        "lightning": lambda p: lightning_io.save_checkpoint(state, p),
    }
    try:
        for name, save in variants.items():  # warm-up: first-use costs, page allocation
            _timed(save, name)()
        samples = interleave({n: _timed(s, n) for n, s in variants.items()}, reps)
    finally:
        shutil.rmtree(OUT, ignore_errors=True)
    hash_ms = median([_hash_s(state) for _ in range(reps)]) * 1e3
    ms = {k: median(v) * 1e3 for k, v in samples.items()}
    size = f"{mib} MiB"
    fsync_cost = ms["save_atomic"] - ms["atomic"]
    where = f"median of {reps}"
    nofsync = paired(samples["atomic"], samples["torch.save"])
    return [
        Row(
            f"save {size}: atomic_write(fsync=False) vs torch.save, ms"
            f" ({where}; {spread(samples['atomic'])})",
            f"{ms['atomic']:.0f} ms",
            f"{ms['torch.save']:.0f} ms (torch.save(state, path); {spread(samples['torch.save'])})",
            nofsync,
            "≤ 1.05×",
            nofsync <= 1.05,
        ),
        Row(
            f"save {size}: the checksum alone: xxh3_128 of the same bytes in memory, ms"
            f" ({where}; ratio: share of torch.save; atomic_write hashes big chunks on a"
            " helper thread while it writes them, so little of it adds to the save)",
            f"{hash_ms:.1f} ms ({mib / 1024 / hash_ms * 1e3:.0f} GiB/s)",
            f"{ms['torch.save']:.0f} ms (torch.save)",
            hash_ms / ms["torch.save"],
        ),
        Row(
            f"save {size}: atomic_write with fsync (the default) vs torch.save, ms ({where})",
            f"{ms['save_atomic']:.0f} ms (fsync costs {fsync_cost:+.0f} ms)",
            f"{ms['torch.save']:.0f} ms (torch.save, not durable)",
            paired(samples["save_atomic"], samples["torch.save"]),
        ),
        Row(
            f"save {size}: atomic_write with fsync vs torch.save + fsync, ms ({where})",
            f"{ms['save_atomic']:.0f} ms",
            f"{ms['torch.save+fsync']:.0f} ms (torch.save + os.fsync, no rename)",
            paired(samples["save_atomic"], samples["torch.save+fsync"]),
        ),
        Row(
            f"save {size}: CkptDashCallback's save (save_atomic) vs Lightning's"
            f" TorchCheckpointIO, ms ({where})",
            f"{ms['save_atomic']:.0f} ms",
            f"{ms['lightning']:.0f} ms (TorchCheckpointIO.save_checkpoint, no fsync)",
            paired(samples["save_atomic"], samples["lightning"]),
        ),
    ]
