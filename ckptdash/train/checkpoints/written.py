"""Finding what other code really wrote when it was handed a checkpoint path.

A framework plugin (a Lightning ``CheckpointIO``) is given a path and may write the files
somewhere else: a ``store/`` subfolder, a different mount, an object-store cache. ckptdash
records what it can see and check, and never fails the training for what it cannot:

1. the plugin tells: a method ``ckptdash_written_path(path)`` returning the real path;
2. else the path it was given, if something is there;
3. else the one file (or directory named like the checkpoint) that appeared or changed
   during the save in the given path's folder or a folder up to two levels below it,
   found by comparing a listing taken before the save with one taken after (or, when
   nothing looks changed, the one file there with the checkpoint's name);
4. else nothing: the save is recorded as *unvalidated* (no size, no checksum) with a warning.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

# How far below the given path's folder a plugin's real files are looked for, and how many
# entries one listing reads at most (a folder of a million files is not searched).
_DEPTH: Final = 2
_MAX_ENTRIES: Final = 20_000

Listing = dict[str, tuple[bool, int, int, int]]
"""Path -> (is a directory, size, mtime in ns, inode), for the entries under a folder."""


@dataclass(frozen=True)
class Located:
    """Where the files of a save are (``path``), or why they could not be found."""

    path: str | None
    """The absolute path holding the checkpoint; None: nothing ckptdash can see."""
    why_not: str = ""
    """Why ``path`` is None (for the ``unvalidated`` field and the warning)."""


def listing(folder: str | os.PathLike[str], skip: Iterable[Path] = ()) -> Listing:
    """The entries under ``folder`` (down to two levels below it), except those under ``skip``."""
    out: Listing = {}
    skipped = {os.path.abspath(p) for p in skip}
    pending = [(os.path.abspath(folder), 0)]
    while pending and len(out) < _MAX_ENTRIES:
        here, depth = pending.pop()
        try:
            entries = list(os.scandir(here))
        except OSError:
            continue  # missing (the first save creates it) or unreadable: nothing to compare
        for entry in entries:
            if entry.path in skipped:
                continue
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            out[entry.path] = (is_dir, 0 if is_dir else st.st_size, st.st_mtime_ns, st.st_ino)
            if is_dir and depth < _DEPTH:
                pending.append((entry.path, depth + 1))
    return out


def reported_by(plugin: Any, given: str) -> str | None:
    """The real path a plugin reports for ``given`` through ``ckptdash_written_path``, if any."""
    report = getattr(plugin, "ckptdash_written_path", None)
    if not callable(report):
        return None
    real = report(given)
    return None if real is None else os.path.abspath(os.fspath(real))


def locate(given: str, before: Listing, after: Listing) -> Located:
    """Where a save handed ``given`` wrote, judged from the listings around it (see the module)."""
    if os.path.lexists(given):
        return Located(given)
    name = os.path.basename(given)
    stem = os.path.splitext(name)[0]
    new_dirs = [p for p, (d, *_) in after.items() if d and p not in before]
    changed_files = [p for p, meta in after.items() if not meta[0] and before.get(p) != meta]
    # A new directory is the checkpoint only when it is named like it (a folder of shards);
    # otherwise it merely holds the files (the ``store/`` a first save creates).
    named_dirs = [p for p in new_dirs if os.path.basename(p) in (name, stem)]
    outside_named = [f for f in changed_files if not any(_under(f, d) for d in named_dirs)]
    # Last: a file rewritten in place at the same size within one tick of the filesystem's
    # clock looks unchanged; if exactly one file near the path has its name, it is that one.
    same_name = [p for p, meta in after.items() if not meta[0] and os.path.basename(p) == name]
    for candidates in (
        named_dirs + [f for f in outside_named if os.path.basename(f) == name],
        [f for f in outside_named if stem and stem in os.path.basename(f)],
        changed_files if not named_dirs else [],
        same_name,
    ):
        if len(candidates) == 1:
            return Located(candidates[0])
        if len(candidates) > 1:
            shown = ", ".join(sorted(candidates)[:3])
            return Located(None, f"several files changed during the save ({shown}, ...)")
    return Located(
        None,
        f"nothing at {given} and no file appeared near it: the CheckpointIO writes where"
        " ckptdash cannot see (give it a ckptdash_written_path(path) method to say where)",
    )


def _under(path: str, folder: str) -> bool:
    return path.startswith(folder.rstrip(os.sep) + os.sep)
