"""Whether a run's own job started it: the evidence every scheduler's ``verify_job`` checks
before any action taken on a job id read from a run's log (any scheduler).

A run's log is writable by everyone who can write its folder (a group project directory), so
a job id in it proves nothing by itself: a group member can add a run to ``RUNS/`` whose log
names the owner's unrelated job. What such a member cannot do is create a file, or a folder,
owned by the owner. The first line of an attempt's rank-0 event file is the ``run_started``
its training process wrote, under the job's own account; so a job id counts as *this run's*
only when

* it is the ``job_id`` of a ``run_started`` opening a file ``A{attempt}.R0000.*`` in the run's
  ``events/`` folder, and
* that file (a regular file with one link, opened without following a link) and the
  ``events/`` folder itself are owned by the account the scheduler says the job runs as
  (SLURM's ``UserId``, Grid Engine's ``JB_uid``), and no folder of the run may be written by
  anyone else (:func:`ckptdash.rundir.door.untrusted`): a hard link from the owner's
  group-writable log into a group-writable ``events/`` is the owner's file, but not the run's.

Nothing here runs a scheduler's command; files are opened without following links, non-blocking,
and read for one capped line each.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ckptdash.events import RunStarted, decode_line
from ckptdash.rundir import door

MAX_FIRST_LINE_BYTES: Final = 64 * 1024
"""A ``run_started`` line is a few hundred bytes; a longer first line is not read whole."""
MAX_FILES: Final = 10_000
"""At most this many event file names are looked at (a flooded folder is not read for ever)."""

_RANK0: Final = re.compile(r"^A(\d{4,9})\.R0000\.")


@dataclass(frozen=True)
class Evidence:
    """What the run's folder says about ``job_id``: the rank-0 files whose ``run_started``
    names it, each with the uid that owns it, and the uid owning ``events/``."""

    events_dir: str
    events_uid: int | None
    """None: no ``events/`` folder that is a real folder (missing, a link, unreadable)."""
    files: tuple[tuple[str, int], ...]
    """(file name, owner uid) of each rank-0 file that opens with ``run_started`` naming
    the job."""

    untrusted: str = ""
    """Why the run's folders are not its owner's alone ("" when they are)."""

    def refusal(self, job_id: str, job_uid: int) -> str:
        """Why the run does not vouch for ``job_id`` running as ``job_uid`` ("" when it does)."""
        if self.events_uid is None:
            return f"{self.events_dir} is not a folder (missing, or a link)"
        if not self.files:
            return f"no run_started in {self.events_dir} names job {job_id}"
        if self.events_uid != job_uid:
            return (
                f"{self.events_dir} belongs to uid {self.events_uid}, not to the job's user"
                f" (uid {job_uid}): another account made this run"
            )
        if not any(uid == job_uid for _, uid in self.files):
            name, uid = self.files[0]
            return (
                f"the run_started naming job {job_id} ({name}) was written by uid {uid}, not"
                f" by the job's user (uid {job_uid})"
            )
        if self.untrusted:  # its evidence may have been written by anyone who can write it
            return f"the run is not its owner's alone: {self.untrusted}"
        return ""


def gather(root: str | os.PathLike[str], job_id: str) -> Evidence:
    """Read the run at ``root`` for the ``run_started`` lines naming ``job_id``."""
    events = Path(root) / "events"
    why = door.untrusted(root)
    try:
        st = os.lstat(events)
    except OSError:
        return Evidence(str(events), None, ())
    if not stat.S_ISDIR(st.st_mode):
        return Evidence(str(events), None, ())
    try:
        names = sorted(n for n in _listing(events) if _RANK0.match(n))
    except OSError:
        return Evidence(str(events), st.st_uid, (), why)
    found: list[tuple[str, int]] = []
    for name in names:
        opened = _first_line(events / name)
        if opened is None:
            continue
        uid, line = opened
        try:
            record = decode_line(line)
        except Exception:  # hostile bytes: this file vouches for nothing
            continue
        if isinstance(record, RunStarted) and record.job_id == job_id:
            found.append((name, uid))
    return Evidence(str(events), st.st_uid, tuple(found), why)


def _listing(folder: Path) -> list[str]:
    out: list[str] = []
    with os.scandir(folder) as it:
        for entry in it:
            out.append(entry.name)
            if len(out) >= MAX_FILES:
                break
    return out


def _first_line(path: Path) -> tuple[int, bytes] | None:
    """(owner uid, first line) of a regular file with one link (a hard link is another file),
    through the one door: never following a link nor blocking."""
    try:
        with door.open_path(path) as (fd, st):
            if st.st_nlink != 1:
                return None
            data = os.read(fd, MAX_FIRST_LINE_BYTES)
    except OSError:
        return None
    end = data.find(b"\n")
    if end < 0:
        return None
    return st.st_uid, data[: end + 1]


def refusal(
    scheduler: str, job: str, user: str, uid: int, run_root: str | os.PathLike[str] | None
) -> str:
    """Why ckptdash may not act on ``scheduler``'s job ``job``, which the scheduler says runs
    as ``user`` (``uid``) ("" when it may): it must be the acting user's, and with ``run_root``
    (the id came from that run's log) the run's own files must vouch for it."""
    me = os.geteuid()
    if uid != me:
        return (
            f"{scheduler} job {job} belongs to {user} (uid {uid}), not to you (uid {me}):"
            " ckptdash acts only on your own jobs"
        )
    if run_root is not None:
        why = gather(run_root, job).refusal(job, uid)
        if why:
            return (
                f"{scheduler} job {job}: not started by the run {os.fspath(run_root)}: {why}; not"
                " acting on it (if it is yours, name it: `ckptdash requeue RUN_DIR --job"
                f" {job} ...`)"
            )
    return ""
