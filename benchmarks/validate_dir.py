"""Validating a directory checkpoint: every file hashed against its manifest, pages cached.

A directory of 8 files (1 GiB in all; 256 MiB with ``--quick``) is written once and
published with its manifest (:func:`ckptdash.rundir.manifest.write`), then read until its
pages are cached. Taking turns, the baseline reads every file once on one thread
(``readinto`` a 4 MiB buffer: the least any validation must do) and ckptdash runs
:func:`ckptdash.rundir.manifest.verify` (sizes, then XXH3 of every file on several threads).
Goal: validation at ≥ 2 GB/s. The ratio is ckptdash's time ÷ the plain read's.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from timing import Row, interleave, median, paired, spread

from ckptdash.rundir import manifest

FILES = 8
GOAL_GBPS = 2.0


def _plain_read(root: Path) -> float:
    buf = memoryview(bytearray(4 << 20))
    began = time.perf_counter()
    for f in sorted(root.iterdir()):
        if f.name == manifest.MANIFEST_NAME:
            continue
        with open(f, "rb", buffering=0) as fh:
            while fh.readinto(buf):
                pass
    return time.perf_counter() - began


def _verify(root: Path, digest: str) -> float:
    began = time.perf_counter()
    problem = manifest.verify(root, expected_digest=digest)
    elapsed = time.perf_counter() - began
    assert problem is None, problem
    return elapsed


def run(quick: bool) -> list[Row]:
    total = (256 if quick else 1024) << 20
    reps = 5 if quick else 11
    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-") as tmp:
        root = Path(tmp) / "ckpt"
        root.mkdir()
        block = os.urandom(1 << 20)
        for i in range(FILES):
            with open(root / f"shard{i}.bin", "wb") as f:
                for _ in range(total // FILES // len(block)):
                    f.write(block)
        size, digest = manifest.write(root)
        _plain_read(root)  # the pages are now cached
        times = interleave(
            {"plain": lambda: _plain_read(root), "verify": lambda: _verify(root, digest)}, reps
        )
    gbps = size / median(times["verify"]) / 1e9
    base = size / median(times["plain"]) / 1e9
    return [
        Row(
            f"validate a {size >> 20} MiB directory of {FILES} files (cached)",
            f"{gbps:.2f} GB/s ({spread(times['verify'])})",
            f"plain read {base:.2f} GB/s ({spread(times['plain'])})",
            paired(times["verify"], times["plain"]),
            f"≥ {GOAL_GBPS:g} GB/s",
            gbps >= GOAL_GBPS,
        )
    ]


if __name__ == "__main__":
    from timing import table

    print(table(run(quick=False)))
