"""Which attempt of the run this one is, numbered after every earlier job's attempts."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Final

from ckptdash.events import RunStarted, decode_lines
from ckptdash.rundir import RunDir
from ckptdash.rundir.safe_read import open_regular
from ckptdash.schedulers.base import Scheduler
from ckptdash.tail import MAX_LINE_BYTES

_ATTEMPT_RE: Final = re.compile(r"^A(\d{4,})\.")
_RANK0_RE: Final = re.compile(r"^A(\d{4,})\.R0000\.")
MAX_ATTEMPT: Final = 2**31 - 1
"""The largest attempt number a file name may carry to count. No run restarts two billion
times; a name like ``A9223372036854775807.R0000…`` (anyone who can write ``events/`` can make
one) would otherwise make the next attempt's number overflow the schema at every start."""


def attempt_number(run: RunDir, scheduler: Scheduler) -> int:
    """This attempt's number in ``run`` (rank 0 decides; the session broadcasts it)."""
    known = scheduler.attempt
    files = run.event_files()
    if known is None:
        seen = [_number(m) for p in files if (m := _ATTEMPT_RE.match(p.name))]
        in_range = [a for a in seen if a <= MAX_ATTEMPT]
        return max(in_range) + 1 if in_range else 0
    # The scheduler counts this job's restarts only. A new job submitted into a run
    # directory that earlier jobs used numbers its attempts after theirs; otherwise its
    # attempt 0 would merge with theirs in the history.
    job = scheduler.job_id
    others = [a for a, j in _attempt_jobs(files).items() if job is not None and j != job]
    return (max(others) + 1 if others else 0) + known


def _attempt_jobs(files: list[Path]) -> dict[int, str | None]:
    """The job id of each earlier attempt, from the ``run_started`` that opens its rank-0 file
    (one line read per attempt, not the whole log)."""
    jobs: dict[int, str | None] = {}
    for path in files:
        m = _RANK0_RE.match(path.name)
        if m is None or _number(m) > MAX_ATTEMPT:
            continue
        try:
            fd, _st = open_regular(path)  # a FIFO named like an event file never blocks a start
            with os.fdopen(fd, "rb") as f:
                first = f.readline(MAX_LINE_BYTES + 1)  # a hostile first line is not read whole
        except OSError:
            continue
        for event in decode_lines(first, str(path)) if first.endswith(b"\n") else ():
            if isinstance(event, RunStarted):
                jobs.setdefault(int(m.group(1)), event.job_id)
    return jobs


def _number(m: re.Match[str]) -> int:
    digits = m.group(1)
    # int() of a 5,000-digit name costs more than it should; anything that long is out of range.
    return int(digits) if len(digits) <= 12 else MAX_ATTEMPT + 1
