"""What an idle dashboard costs when a run directory holds 100,000 empty event files.

A compromised node (or a buggy tool) can fill ``events/`` with files that never change. The
follower polls every second; before issue 11 each poll listed the folder and ``stat``-ed every
file (a third of a core). Now a file unchanged for ``COLD_AFTER`` polls is *cold*: a poll
looks at one group of them (1/``COLD_EVERY``), and the folder is listed again only when it
changes. Goal: under 5 % of a core at the default one poll a second.

Measured as process CPU time over a run of polls of a real :class:`RunFollower` (poll mode,
the mode used on NFS) while the main thread sleeps, per poll, against the same follower on
the same run without the junk files (the baseline), in the same run of the benchmark.

    .venv/bin/python benchmarks/idle_watch.py [--quick]
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from timing import Row

from ckptdash import Monitor
from ckptdash.dash.feed.follow import RunFollower
from ckptdash.rundir import RunDir
from ckptdash.tail import COLD_AFTER, COLD_EVERY

POLL_S = 0.05  # faster than the default 1 s so the benchmark takes seconds, not minutes


def _make_run(root: Path, junk: int) -> Path:
    with Monitor(root, install_signals=False) as monitor:
        monitor.step(1)
        monitor.save({"step": 1})
    folder = os.fsencode(RunDir(root).events)
    for i in range(junk):
        name = os.path.join(folder, b"A0000.R%04d.junk.%d.jsonl" % (i % 9999, i))
        os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))
    # The listing is reused only once the folder's last change is a little in the past.
    past = time.time() - 60
    os.utime(folder, (past, past))
    return root


def _cpu_per_poll(root: Path, polls: int) -> tuple[float, float]:
    """(CPU seconds per poll while the files are still warm, once they are cold)."""
    with RunFollower(root, mode="poll", poll_interval_s=POLL_S) as w:
        if not w.wait_loaded(600):
            raise RuntimeError(f"{root}: the follower never loaded")

        def measure(n: int) -> float:
            start_polls, start_cpu = w.polls, time.process_time()
            while w.polls < start_polls + n:
                time.sleep(POLL_S / 4)  # the main thread idles; the follower's thread works
            return (time.process_time() - start_cpu) / (w.polls - start_polls)

        warm = measure(COLD_AFTER - 2)  # every file still looked at by every poll
        while w.polls < COLD_AFTER + 2:
            time.sleep(POLL_S / 4)
        cold = measure(polls)
    return warm, cold


def run(quick: bool) -> list[Row]:
    junk = 20_000 if quick else 100_000
    polls = COLD_EVERY * (2 if quick else 4)
    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-idle-") as tmp:
        flooded = _make_run(Path(tmp) / "flooded", junk)
        plain = _make_run(Path(tmp) / "plain", 0)
        _, base = _cpu_per_poll(plain, polls)
        warm, cold = _cpu_per_poll(flooded, polls)
    share = cold / 1.0  # at the default poll_interval_s=1.0
    return [
        Row(
            f"idle follower, {junk:,} empty event files: CPU per poll once cold"
            f" (mean of {polls} polls; {warm * 1e3:.0f} ms while warm, i.e. before they go cold)",
            f"{cold * 1e3:.1f} ms ({share:.1%} of a core at 1 poll/s)",
            f"{base * 1e3:.1f} ms (same run without the files)",
            cold / base if base > 0 else None,
            goal="< 5 % of a core",
            met=share < 0.05,
        )
    ]


if __name__ == "__main__":
    for row in run("--quick" in sys.argv):
        print(row)
