"""The manifest of a directory checkpoint: every file's relative path, size and XXH3.

A checkpoint that is a directory (DCP shards, a Hugging Face ``checkpoint-N``,
Accelerate's ``checkpoint_N``, a Lightning sharded save) carries its manifest
inside itself, as ``MANIFEST_NAME``, so a reader finds it without the event log.
The ``checkpoint_saved`` event records the manifest's own digest as its
``checksum``: a manifest that was replaced or edited no longer matches it.

Validation (:func:`verify`) reads every listed file and names the first file
that is missing, resized, changed, or a leftover temp file of an interrupted
write. Files are hashed on several threads (XXH3 releases the GIL), so a
directory of shards validates at the speed of the page cache, not one core.
Files are read through read-only memory maps (no copy); a file that another
process truncates while it is being hashed would end this process with SIGBUS,
which is why validation runs when an attempt starts, before anything writes.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Final

import msgspec
import xxhash

from ckptdash.events.fields import DECODE_ERRORS
from ckptdash.rundir import TEMP_PREFIX, atomic_write, fsync_dir
from ckptdash.rundir.hashing import CHECKSUM_ALGO
from ckptdash.rundir.safe_read import open_regular, read_capped

MANIFEST_NAME: Final = ".ckptdash-manifest.json"
_CHUNK: Final = 4 << 20
_MAX_THREADS: Final = 8
MAX_MANIFEST_BYTES: Final = 64 << 20
"""A manifest larger than this (about 400,000 files) is refused unread."""


class ManifestEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One file of a directory checkpoint."""

    path: str  # relative to the checkpoint directory, "/"-separated
    size_bytes: int
    checksum: str  # "xxh3_128:<32 hex>"


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """Content of ``MANIFEST_NAME``: the files, sorted by path."""

    v: int = 1
    files: list[ManifestEntry]

    @property
    def size_bytes(self) -> int:
        return sum(f.size_bytes for f in self.files)


def is_temp_name(name: str) -> bool:
    """A leftover of an interrupted write: ckptdash's temp prefix, or a ``.tmp`` suffix
    (what ``torch.save``-style writers and DCP's staging use)."""
    return name.startswith(TEMP_PREFIX) or name.endswith((".tmp", ".partial"))


def _files(root: Path) -> list[str]:
    """Relative paths of the regular files under ``root``, except the manifest, sorted."""
    out: list[str] = []
    for dirpath, _dirs, names in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        for name in names:
            rel = name if rel_dir == "." else f"{rel_dir}/{name}".replace(os.sep, "/")
            if rel != MANIFEST_NAME:
                out.append(rel)
    return sorted(out)


def hash_file(
    path: str | os.PathLike[str], *, fsync: bool = False, limit: int | None = None
) -> tuple[int, str]:
    """Size and ``xxh3_128:`` checksum of one file.

    The file is hashed through a read-only memory map: from cached pages that is two
    to three times faster than reading it into a buffer (no copy). Where a file cannot
    be mapped (empty, or a filesystem without mmap) it is read in 4 MiB chunks. Only a
    regular file is hashed (a FIFO or a device is refused with
    :class:`~ckptdash.errors.NotARegularFile`, never blocked on); with ``limit`` (the size
    the manifest lists) at most ``limit + 1`` bytes are.
    """
    h = xxhash.xxh3_128()
    fd, st = open_regular(path, follow_symlinks=True)
    with open(fd, "rb", buffering=0) as f:
        if fsync:
            # Read-only descriptors cannot fsync on some filesystems; the data is written.
            with contextlib.suppress(OSError):
                os.fsync(f.fileno())
        size = st.st_size if limit is None else min(st.st_size, limit + 1)
        try:
            mapped = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) if size else None
        except (OSError, ValueError):
            mapped = None
        if mapped is not None:
            with mapped:
                h.update(mapped)
            return size, f"{CHECKSUM_ALGO}:{h.hexdigest()}"
        size = 0
        view = memoryview(bytearray(_CHUNK))
        left = -1 if limit is None else limit + 1
        while left and (n := f.readinto(view if left < 0 else view[: min(_CHUNK, left)])):
            h.update(view[:n])
            size += n
            left = left - n if left > 0 else left
    return size, f"{CHECKSUM_ALGO}:{h.hexdigest()}"


def _pool_map(
    root: Path, rels: list[str], *, fsync: bool, limits: list[int] | None = None
) -> list[tuple[int, str]]:
    # A pool per call, not a module-level one: a forked DataLoader worker would inherit it broken.
    caps: list[int | None] = list(limits) if limits is not None else [None] * len(rels)

    def one(i: int) -> tuple[int, str]:
        return hash_file(root / rels[i], fsync=fsync, limit=caps[i])

    if len(rels) <= 1:
        return [one(i) for i in range(len(rels))]
    workers = min(_MAX_THREADS, len(rels), max(2, os.cpu_count() or 2))
    with ThreadPoolExecutor(workers, thread_name_prefix="ckptdash-hash") as pool:
        return list(pool.map(one, range(len(rels))))


def build(root: str | os.PathLike[str]) -> Manifest:
    """Fsync and hash every file under ``root`` (several at a time); the manifest of them."""
    base = Path(root)
    rels = _files(base)
    bad = [r for r in rels if is_temp_name(r.rsplit("/", 1)[-1])]
    if bad:
        raise ValueError(
            f"{base / bad[0]}: a temp file of an unfinished write is inside the checkpoint;"
            " the writer has not finished (or failed): wait for it before publishing"
        )
    results = _pool_map(base, rels, fsync=True)
    return Manifest(
        files=[
            ManifestEntry(path=r, size_bytes=s, checksum=c)
            for r, (s, c) in zip(rels, results, strict=True)
        ]
    )


def write(root: str | os.PathLike[str]) -> tuple[int, str]:
    """Make the directory checkpoint ``root`` durable and write its manifest into it.

    Every file is fsync'ed and hashed, the manifest is written atomically, and
    every directory is fsync'ed. Returns (total size of the files, digest of the
    manifest), the ``size_bytes`` and ``checksum`` of its ``checkpoint_saved``.
    """
    base = Path(root)
    manifest = build(base)
    data = msgspec.json.encode(manifest) + b"\n"
    atomic_write(base / MANIFEST_NAME, data)
    for dirpath, _dirs, _names in os.walk(base):
        fsync_dir(Path(dirpath))
    return manifest.size_bytes, digest(data)


def digest(data: bytes) -> str:
    """The checksum of a manifest's bytes, as its ``checkpoint_saved`` records it."""
    return f"{CHECKSUM_ALGO}:{xxhash.xxh3_128_hexdigest(data)}"


def read(root: str | os.PathLike[str]) -> tuple[Manifest, str]:
    """The manifest inside ``root`` and the digest of its bytes.

    Raises ``FileNotFoundError`` without one, :class:`~ckptdash.errors.NotARegularFile` for a
    link, a FIFO, a device or one over :data:`MAX_MANIFEST_BYTES`, and ``ValueError`` when it
    does not parse.
    """
    # The run's own file: never through a link, never a FIFO or a device, never unbounded.
    data = read_capped(Path(root) / MANIFEST_NAME, MAX_MANIFEST_BYTES)
    try:
        return msgspec.json.decode(data, type=Manifest), digest(data)
    except DECODE_ERRORS as exc:
        raise ValueError(f"{Path(root) / MANIFEST_NAME}: unreadable manifest ({exc})") from None


def verify(
    root: str | os.PathLike[str],
    *,
    expected_digest: str = "",
    size_bytes: int | None = None,
    checksums: bool = True,
) -> str | None:
    """Why the directory checkpoint ``root`` is not what its manifest lists, or None if it is.

    ``expected_digest`` (from the ``checkpoint_saved`` event; empty to trust the
    manifest as found) must match the manifest's bytes. Every listed file must
    exist with its size and (with ``checksums``) its XXH3; a temp file of an
    interrupted write inside the directory makes it invalid too. The reason
    names the file, e.g. ``"optimizer.pt missing"``.
    """
    base = Path(root)
    if not base.is_dir():
        return "directory is missing"
    try:
        manifest, found = read(base)
    except FileNotFoundError:
        return f"{MANIFEST_NAME} missing (the save never finished, or it was removed)"
    except (OSError, ValueError) as exc:
        return f"{MANIFEST_NAME} unreadable: {exc}"
    if expected_digest and found != expected_digest:
        return f"{MANIFEST_NAME} does not match the recorded one (replaced or edited)"
    if size_bytes is not None and manifest.size_bytes != size_bytes:
        return f"manifest lists {manifest.size_bytes} bytes != recorded {size_bytes}"
    present = set(_files(base))
    for entry in manifest.files:
        if entry.path.startswith("/") or ".." in entry.path.split("/"):
            return f"{entry.path!r}: the manifest names a file outside the checkpoint"
        if entry.path not in present:
            return f"{entry.path} missing"
    for rel in sorted(present):
        if is_temp_name(rel.rsplit("/", 1)[-1]):
            return f"{rel}: leftover temp file of an interrupted write"
    for entry in manifest.files:
        try:
            size = (base / entry.path).stat().st_size
        except OSError as exc:
            return f"{entry.path} unreadable: {exc.strerror}"
        if size != entry.size_bytes:
            return f"{entry.path} is {size} bytes, manifest says {entry.size_bytes} (truncated?)"
    if not checksums:
        return None
    rels = [e.path for e in manifest.files]
    try:
        results = _pool_map(base, rels, fsync=False, limits=[e.size_bytes for e in manifest.files])
    except OSError as exc:
        return f"{exc.filename or base} unreadable: {exc.strerror}"
    for entry, (size, checksum) in zip(manifest.files, results, strict=True):
        if size != entry.size_bytes:
            return f"{entry.path} is {size} bytes, manifest says {entry.size_bytes} (changing?)"
        if checksum != entry.checksum:
            return f"{entry.path} changed (checksum does not match the manifest)"
    return None
