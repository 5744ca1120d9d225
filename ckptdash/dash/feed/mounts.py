"""Which way to watch a directory: inotify, or polling where inotify cannot see other hosts.

On NFS, Lustre, GPFS, CIFS and FUSE mounts a file written on another host (the
compute node) raises no inotify event on this one (the login node), so the
dashboard must poll there. The mount is found in ``/proc/self/mountinfo``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final, Literal, TypeAlias

from ckptdash.errors import CkptDashError

WatchMode: TypeAlias = Literal["auto", "inotify", "poll"]
WATCH_MODES: Final[tuple[WatchMode, ...]] = ("auto", "inotify", "poll")

NETWORK_FILESYSTEMS: Final = frozenset(
    {
        "nfs",
        "nfs4",
        "lustre",
        "gpfs",
        "cifs",
        "smb3",
        "smbfs",
        "beegfs",
        "ceph",
        "9p",
        "afs",
        "panfs",
        "wekafs",
        "orangefs",
        "pvfs2",
        "virtiofs",
    }
)
"""Filesystems where another host's writes raise no inotify event here (and any ``fuse.*``)."""


def filesystem_type(
    path: str | os.PathLike[str], mountinfo: str = "/proc/self/mountinfo"
) -> str | None:
    """The type of the filesystem holding ``path`` (``ext4``, ``nfs4``, ``lustre`` …), from
    ``mountinfo``; ``None`` where that cannot be read (not Linux)."""
    target = os.path.realpath(path)
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
    except OSError:
        return None
    best, best_type = "", None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) < 5 or not right:
            continue
        mount = fields[4].encode().decode("unicode_escape")  # "\040" is a space
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, best_type = mount, right.split()[0]
    return best_type


def choose_mode(path: str | os.PathLike[str], requested: WatchMode) -> tuple[WatchMode, str]:
    """``inotify`` or ``poll`` for ``path``, and the reason shown to the user."""
    if requested not in WATCH_MODES:
        raise CkptDashError(f"watch mode {requested!r}: use one of {', '.join(WATCH_MODES)}")
    if requested == "poll":
        return "poll", "polling (asked for)"
    if requested == "inotify":
        return "inotify", "inotify (asked for)"
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    fstype = filesystem_type(probe)
    if fstype is not None and (fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse.")):
        return "poll", f"polling ({fstype}: writes from other hosts raise no inotify event)"
    return "inotify", "inotify"
