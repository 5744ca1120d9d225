"""How the readers' costs grow with ranks, hours and runs (issue 24), against 8 ranks × 1 h.

Writes its own run directories in the documented format (``ckptdash._dev.scale_runs``: every
rank pulsing at 1 Hz into its pulse record and once a minute into the log, as the training side
does today — ``--pulses-in-log``: every pulse in the log, as before the records — rank 0's
heartbeats every 10 s and a
checkpoint every 5 min, the attempt live until now), then measures, each against the
8-rank × 1 h run *in the same run of the benchmark* (the two take turns):

* ``ckptdash status --json``, ``ckptdash health``, ``ckptdash goodput``: wall time of the
  command (a subprocess, Python's start included), median of ``--reps`` (3), each a first
  open (the run's snapshot removed before: the whole log replayed, the snapshot written);
* ``ckptdash status --json`` again, from the snapshot the first open left (the run has not
  grown since: the tail is empty);
* ``ckptdash watch PATH --once``: peak RSS of the process (``wait4``);
* ``ckptdash watch PATH`` left running: CPU share of one core over ~10 s once its first look
  is done (the baseline and the folders only).

Sizes: 8 × 1 h (the baseline), 64 × 1 h, 256 × 1 h, 1,024 × 1 h and folders of 100 runs of
8 ranks × 15 min; ``--full`` adds 256 × 24 h, 1,024 × 24 h (2.5 and 10 GB of log) and a
folder of 1,000 runs; ``--quick`` keeps the baseline, 64 × 1 h and a folder of 20 runs
(under 2 minutes on 2 busy cores). Each size is written just before it is measured and
deleted after, under ``benchmarks/out/`` (gitignored). Results: ``benchmarks/out/scale.json``
and ``scale.md``.

    .venv/bin/python benchmarks/scale.py [--quick | --full] [--reps N] [--size '1,000 runs']
        [--pulses-in-log]
    .venv/bin/python benchmarks/run.py --only scale [--quick | --full]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from timing import Row, interleave, median, paired, table

from ckptdash._dev.scale_runs import Written, write_run
from ckptdash.state.snapshot import SNAPSHOT_DIR

OUT = Path(__file__).resolve().parent / "out"
COMMANDS = (("status", ("status", "--json")), ("health", ("health",)), ("goodput", ("goodput",)))
IDLE_S = 10.0
# The generated attempts end when they are written; a long measurement must not see them go
# stale (watch would then write alerts into the data it measures).
QUIET = ("--threshold", "stale_after_s=1e9")


@dataclass(frozen=True)
class Size:
    label: str
    ranks: int
    seconds: int
    runs: int = 1  # > 1: a folder of this many runs
    idle_cpu: bool = False

    @property
    def folder(self) -> bool:
        return self.runs > 1


BASELINE = Size("8 ranks × 1 h", 8, 3600, idle_cpu=True)


def sizes(quick: bool, full: bool) -> list[Size]:
    if quick:
        return [
            Size("64 ranks × 1 h", 64, 3600),
            Size("folder: 20 runs × 8 × 15 min", 8, 900, 20, True),
        ]
    out = [
        Size("64 ranks × 1 h", 64, 3600),
        Size("256 ranks × 1 h", 256, 3600),
        Size("1,024 ranks × 1 h", 1024, 3600),
        Size("folder: 100 runs × 8 × 15 min", 8, 900, 100, True),
    ]
    if full:
        out += [
            Size("256 ranks × 24 h", 256, 86400),
            Size("1,024 ranks × 24 h", 1024, 86400),
            Size("folder: 1,000 runs × 8 × 15 min", 8, 900, 1000, True),
        ]
    return out


def ckptdash(*args: str) -> list[str]:
    return [sys.executable, "-m", "ckptdash", *args]


def wall_s(argv: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr[-400:]!r}")
    return elapsed


def follow(path: Path) -> list[str]:
    """A process that opens ``path`` as the dashboard does (its follower: the tailers, the
    states and the snapshots the views are drawn from, without Panel) and exits once loaded."""
    code = (
        "import sys\n"
        "from ckptdash.dash.feed.follow import RunFollower\n"
        "with RunFollower(sys.argv[1], mode='poll') as f:\n"
        "    assert f.wait_loaded(1200), 'not loaded in 20 min'\n"
    )
    return [sys.executable, "-c", code, str(path)]


def peak_rss_bytes(argv: list[str]) -> float:
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {err[-400:]!r}")
    return float(usage.ru_maxrss * 1024)  # Linux: KiB


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_cpu_share(path: Path, seconds: float = IDLE_S, settle_timeout_s: float = 600) -> float:
    """CPU share of one core of a running ``ckptdash watch PATH`` once its first look is done.

    The first look is over when one second passes with under a tenth of a core used."""
    proc = subprocess.Popen(
        ckptdash("watch", str(path), *QUIET), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + settle_timeout_s
        before = _cpu_s(proc.pid)
        while True:
            time.sleep(1.0)
            if proc.poll() is not None:
                raise RuntimeError(f"ckptdash watch {path} exited {proc.returncode}")
            now = _cpu_s(proc.pid)
            if now - before < 0.1 or time.monotonic() > deadline:
                break
            before = now
        start_cpu, start = _cpu_s(proc.pid), time.monotonic()
        time.sleep(seconds)
        return (_cpu_s(proc.pid) - start_cpu) / (time.monotonic() - start)
    finally:
        proc.terminate()
        proc.wait(30)


@dataclass
class Data:
    path: Path
    written: list[Written]

    @property
    def bytes(self) -> int:
        return sum(w.bytes for w in self.written)


def generate(where: Path, size: Size, pulses_in_log: bool = False) -> Data:
    root = where / size.label.replace(" ", "").replace("×", "x").replace(":", "").replace(",", "")

    def one(path: Path) -> Written:
        return write_run(path, ranks=size.ranks, seconds=size.seconds, pulses_in_log=pulses_in_log)

    if not size.folder:
        return Data(root, [one(root)])
    return Data(root, [one(root / f"run{i:04d}") for i in range(size.runs)])


def forget_snapshots(d: Data) -> None:
    """Remove the snapshots a reader left (``RUN/snapshot/``): the next open is a first one."""
    for folder in [d.path / SNAPSHOT_DIR, *d.path.glob(f"*/{SNAPSHOT_DIR}")]:
        shutil.rmtree(folder, ignore_errors=True)


def measure(
    base: Data, data: Data, size: Size, reps: int, status_only: bool = False
) -> dict[str, dict[str, list[float]]]:
    """{metric: {"base": values, "size": values}}, the two taking turns.

    ``status``, ``health``, ``goodput``: a first open (no snapshot: the whole log replayed,
    and the snapshot written when the log is over the threshold); ``status_snap``: the open
    after it, from the snapshot it left (the run has not grown since)."""
    out: dict[str, dict[str, list[float]]] = {}
    commands = COMMANDS[:1] if size.folder or status_only else COMMANDS  # health, goodput: a run
    for name, args in commands:

        def timed(d: Data, args: tuple[str, ...] = args) -> Callable[[], float]:
            def first_open() -> float:
                forget_snapshots(d)
                return wall_s(ckptdash(*args, str(d.path)))

            return first_open

        out[name] = interleave({"base": timed(base), "size": timed(data)}, reps)
    if not size.folder:

        def again(d: Data) -> Callable[[], float]:
            return lambda: wall_s(ckptdash("status", "--json", str(d.path)))

        for d in (base, data):  # the last first open left its snapshot (if the log is large)
            if not (d.path / SNAPSHOT_DIR).exists():
                again(d)()
        out["status_snap"] = interleave({"base": again(base), "size": again(data)}, reps)
    if status_only:
        return out

    def rss(d: Data) -> float:
        forget_snapshots(d)
        return peak_rss_bytes(ckptdash("watch", str(d.path), "--once", *QUIET))

    watch = {"base": lambda: rss(base), "size": lambda: rss(data)}
    out["watch_rss"] = interleave(watch, 1)

    def follower_rss(d: Data) -> float:
        forget_snapshots(d)  # a first look, as watch's
        return peak_rss_bytes(follow(d.path))

    follower = {"base": lambda: follower_rss(base), "size": lambda: follower_rss(data)}
    out["follower_rss"] = interleave(follower, 1)
    if size.idle_cpu:
        out["watch_idle_cpu"] = interleave(
            {"base": lambda: idle_cpu_share(base.path), "size": lambda: idle_cpu_share(data.path)},
            1,
        )
    return out


def _mb(n: float) -> str:
    return f"{n / 1e6:,.0f} MB" if n >= 1e6 else f"{n / 1e3:,.0f} kB"


def _fmt(metric: str, value: float) -> str:
    if metric in ("watch_rss", "follower_rss"):
        return _mb(value)
    if metric == "watch_idle_cpu":
        return f"{value:.1%} of a core"
    return f"{value:.2f} s"


LABELS = {
    "status": "`status --json` wall, first open",
    "status_snap": "`status --json` wall, from the snapshot",
    "health": "`health` wall",
    "goodput": "`goodput` wall",
    "watch_rss": "`watch --once` peak RSS",
    "follower_rss": "dashboard follower peak RSS",
    "watch_idle_cpu": f"`watch` idle CPU ({IDLE_S:.0f} s)",
}


def rows_for(size: Size, data: Data, figures: dict[str, dict[str, list[float]]]) -> list[Row]:
    rows = []
    for metric, pair in figures.items():
        b, s = pair["base"], pair["size"]
        ratio = paired(s, b) if all(b) else None
        goal, met = "", None
        if metric in ("status", "status_snap", "health", "goodput") and not size.folder:
            goal, met = "≤ 2× (issue 24)", ratio is not None and ratio <= 2
        if metric in ("watch_rss", "follower_rss") and size.folder:
            goal, met = "< 300 MB (issue 24)", median(s) < 300e6
        reps = f", median of {len(s)}" if len(s) > 1 else ""
        rows.append(
            Row(
                f"scale: {LABELS[metric]}, {size.label} ({_mb(data.bytes)} of log{reps})",
                _fmt(metric, median(s)),
                f"{_fmt(metric, median(b))} ({BASELINE.label})",
                ratio,
                goal,
                met,
            )
        )
    return rows


def _say(what: str) -> None:
    print(f"  scale: {what}", file=sys.stderr, flush=True)


def run(
    quick: bool,
    full: bool = False,
    reps: int = 3,
    only: list[str] | None = None,
    status_only: bool = False,
    pulses_in_log: bool = False,
) -> list[Row]:
    OUT.mkdir(exist_ok=True)
    results: list[dict[str, object]] = []
    rows: list[Row] = []
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="scale-", dir=OUT) as tmp:
        where = Path(tmp)
        base = generate(where, BASELINE, pulses_in_log)
        chosen = sizes(quick, full)
        if only:
            chosen = [x for x in sizes(False, True) if any(o in x.label for o in only)]
        for size in chosen:
            start = time.perf_counter()
            data = generate(where, size, pulses_in_log)
            gen_s = time.perf_counter() - start
            _say(f"{size.label}: {_mb(data.bytes)} written in {gen_s:.0f} s")
            try:
                figures = measure(base, data, size, reps, status_only)
            finally:
                shutil.rmtree(data.path)
            rows += rows_for(size, data, figures)
            results.append(
                {
                    "size": size.label,
                    "ranks": size.ranks,
                    "seconds": size.seconds,
                    "runs": size.runs,
                    "log_bytes": data.bytes,
                    "log_lines": sum(w.lines for w in data.written),
                    "generate_s": gen_s,
                    "figures": figures,
                    "ratios": {
                        m: paired(p["size"], p["base"]) if all(p["base"]) else None
                        for m, p in figures.items()
                    },
                }
            )
            _say(f"{size.label}: measured in {time.perf_counter() - start:.0f} s")
    report = {
        "baseline": {"size": BASELINE.label, "log_bytes": base.bytes},
        "mode": "quick" if quick else "full" if full else "default",
        "reps": reps,
        "cpus": os.cpu_count(),
        "load_average_after": os.getloadavg()[0],
        "wall_s": time.perf_counter() - began,
        "sizes": results,
    }
    (OUT / "scale.json").write_text(json.dumps(report, indent=1) + "\n")
    (OUT / "scale.md").write_text(table(rows) + "\n")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="baseline, 64 × 1 h, 20 runs (< 2 min)")
    mode.add_argument("--full", action="store_true", help="add the 24 h runs and 1,000 runs (GBs)")
    parser.add_argument("--reps", type=int, default=3, help="repetitions of each timing (3)")
    parser.add_argument(
        "--size",
        action="append",
        metavar="TEXT",
        help="only the sizes whose label contains TEXT (repeatable), e.g. --size '1,000 runs'",
    )
    parser.add_argument(
        "--status-only",
        action="store_true",
        help="only `status --json`, first open and from the snapshot (the 24 h sizes in minutes)",
    )
    parser.add_argument(
        "--pulses-in-log",
        action="store_true",
        help="write runs as ckptdash 0.1 did: every 1 Hz pulse in the log, no pulse records",
    )
    args = parser.parse_args(argv)
    rows = run(
        args.quick, args.full, max(1, args.reps), args.size, args.status_only, args.pulses_in_log
    )
    print(table(rows))
    print(f"(also {OUT / 'scale.json'} and {OUT / 'scale.md'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
