"""Which way to watch: the mount of a path, and polling on network filesystems."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptdash.dash.feed import mounts
from ckptdash.dash.feed.mounts import choose_mode, filesystem_type
from ckptdash.errors import CkptDashError

MOUNTINFO = """\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
40 22 0:35 / /home rw,relatime shared:2 - nfs4 server:/home rw,vers=4.2
41 22 0:36 / /lustre/scratch rw shared:3 - lustre 10.0.0.1@o2ib:/scratch rw,flock
42 22 0:37 / /mnt/my\\040drive rw shared:4 - fuse.sshfs host:/x rw
"""


@pytest.mark.parametrize(
    ("path", "fstype"),
    [
        ("/home/alice/runs", "nfs4"),
        ("/lustre/scratch/exp", "lustre"),
        ("/mnt/my drive/x", "fuse.sshfs"),
        ("/tmp/x", "ext4"),
        ("/lustre/scratchy", "ext4"),
    ],
)
def test_filesystem_type_reads_the_longest_mount(tmp_path: Path, path: str, fstype: str) -> None:
    """The mount that holds a path is the longest mount point that is a whole-path prefix."""
    info = tmp_path / "mountinfo"
    info.write_text(MOUNTINFO)
    assert filesystem_type(path, str(info)) == fstype


def test_network_filesystems_are_polled(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """auto picks polling on NFS/Lustre/FUSE (no inotify for other hosts' writes), inotify on a
    local disk; a mode given by flag is kept; an unknown one is refused."""
    monkeypatch.setattr(mounts, "filesystem_type", lambda path: "nfs4")
    mode, why = choose_mode(tmp_path, "auto")
    assert mode == "poll"
    assert "nfs4" in why
    assert choose_mode(tmp_path, "inotify")[0] == "inotify"
    monkeypatch.setattr(mounts, "filesystem_type", lambda path: "ext4")
    assert choose_mode(tmp_path, "auto") == ("inotify", "inotify")
    assert choose_mode(tmp_path, "poll")[0] == "poll"
    with pytest.raises(CkptDashError, match="watch mode"):
        choose_mode(tmp_path, "fast")  # type: ignore[arg-type]
