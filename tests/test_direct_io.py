"""Direct (page-cache-bypassing) writes: the same bytes as a buffered write, far less cache.

Background persists write with ``atomic_write(..., direct=True)``. What a user relies on:
the file, its size and its checksum are exactly what a buffered write makes, whatever the
pattern of writes; the bytes really go around the page cache (checked with util-linux's
``fincore``, which reads the kernel's own residency map); and a filesystem that refuses
``O_DIRECT`` loses nothing.
"""

from __future__ import annotations

import errno
import fcntl
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from ckptdash.rundir import atomic_write, direct_io
from ckptdash.rundir.direct_io import DirectFile
from ckptdash.rundir.hashing import checksum_file

BOUNCE = 64 << 10  # a small bounce buffer, so that a few hundred KiB cross many of them


def _pieces(seed: int) -> list[bytes]:
    """Writes of awkward sizes: empty, one byte, exactly a buffer, a buffer and a bit, many."""
    rng = random.Random(seed)
    sizes = [0, 1, BOUNCE, BOUNCE + 1, 4095, 4097, 3 * BOUNCE - 7]
    sizes += [rng.randrange(1, 3 * BOUNCE) for _ in range(20)]
    return [rng.randbytes(n) for n in sizes]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_direct_write_makes_the_same_file_as_a_buffered_one(tmp_path: Path, seed: int) -> None:
    pieces = _pieces(seed)
    with DirectFile(
        os.open(tmp_path / "d.bin", os.O_WRONLY | os.O_CREAT), bounce_bytes=BOUNCE
    ) as f:
        for piece in pieces:
            assert f.write(piece) == len(piece)
        f.flush()
        os.fsync(f.fileno())
    assert (tmp_path / "d.bin").read_bytes() == b"".join(pieces)


def test_atomic_write_direct_matches_buffered_size_and_checksum(tmp_path: Path) -> None:
    state = {"w": torch.rand(3 << 20), "b": torch.arange(1001), "step": 7}  # 12 MiB and a tail
    direct = atomic_write(tmp_path / "direct.ckpt", lambda f: torch.save(state, f), direct=True)
    buffered = atomic_write(tmp_path / "buffered.ckpt", lambda f: torch.save(state, f))
    assert (tmp_path / "direct.ckpt").read_bytes() == (tmp_path / "buffered.ckpt").read_bytes()
    assert (direct.size_bytes, direct.checksum) == (buffered.size_bytes, buffered.checksum)
    assert checksum_file(direct.path) == (direct.size_bytes, direct.checksum)
    loaded = torch.load(direct.path, weights_only=True)
    assert torch.equal(loaded["w"], state["w"]) and loaded["step"] == 7


def _cached_bytes(path: Path) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split()[0])


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux's fincore")
def test_direct_write_leaves_the_page_cache_alone(tmp_path: Path) -> None:
    """32 MiB written buffered stay in the page cache (memory and CPU the kernel spent);
    written direct, at most the unaligned tail (under one bounce buffer) does."""
    probe = os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT)
    supported = direct_io._set_direct(probe, True)
    os.close(probe)
    kind = subprocess.run(
        ["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout.strip()
    if not supported or kind in ("tmpfs", "ramfs"):  # there the page cache is the storage
        pytest.skip(
            f"{tmp_path} is on {kind}, which has no page cache to bypass; run pytest with"
            " --basetemp on a disk-backed filesystem"
        )
    data = os.urandom(32 << 20) + b"tail"
    atomic_write(tmp_path / "buffered.bin", data)
    atomic_write(tmp_path / "direct.bin", data, direct=True)
    assert _cached_bytes(tmp_path / "buffered.bin") >= 30 << 20
    assert _cached_bytes(tmp_path / "direct.bin") < direct_io.BOUNCE_BYTES


def test_a_filesystem_that_refuses_o_direct_gets_the_bytes_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_fcntl = fcntl.fcntl

    def refusing(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fcntl(fd, cmd, arg)

    monkeypatch.setattr(direct_io.fcntl, "fcntl", refusing)
    pieces = _pieces(3)
    with DirectFile(
        os.open(tmp_path / "d.bin", os.O_WRONLY | os.O_CREAT), bounce_bytes=BOUNCE
    ) as f:
        assert not f.direct
        for piece in pieces:
            f.write(piece)
        f.flush()
    assert (tmp_path / "d.bin").read_bytes() == b"".join(pieces)


def test_a_direct_write_refused_midway_continues_buffered_without_losing_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem that accepts the flag but refuses a write (EINVAL: an alignment it needs
    that the bounce buffer does not meet) — the rest goes buffered, the file is whole."""
    real_write = os.write
    refused: list[int] = []

    def write(fd: int, data: memoryview) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT and len(refused) < 1:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(direct_io.os, "write", write)
    pieces = _pieces(4)
    with DirectFile(
        os.open(tmp_path / "d.bin", os.O_WRONLY | os.O_CREAT), bounce_bytes=BOUNCE
    ) as f:
        assert f.direct
        for piece in pieces:
            f.write(piece)
        f.flush()
        assert not f.direct
    assert refused and (tmp_path / "d.bin").read_bytes() == b"".join(pieces)


def test_other_write_errors_are_raised_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fd = os.open(tmp_path / "d.bin", os.O_WRONLY | os.O_CREAT)
    real_write = os.write

    def full(to: int, data: memoryview) -> int:
        if to != fd:
            return real_write(to, data)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_io.os, "write", full)
    with DirectFile(fd, bounce_bytes=BOUNCE) as f, pytest.raises(OSError, match="No space") as exc:
        f.write(b"x" * BOUNCE)
    assert exc.value.errno == errno.ENOSPC
