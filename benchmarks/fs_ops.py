"""The job's filesystem operations on its run directory per second, counted with strace.

A real 8-rank job on one node (``torchrun --nproc-per-node=8``, gloo, a tiny loop at ~20 steps
a second, pulses at 1 Hz, a checkpoint every 2 s in the *saving* case) runs for ``SECONDS``
under ``strace -f -y``; every system call whose path or descriptor lies in the run directory
is counted (writes, opens, stats, renames, fsyncs, listings) over the steady state (after 3 s of
start-up, before the last second). The same job with each rank
writing its own pulse record (``--per-rank``: no local ranks, as a launcher that names none)
is the baseline: issue 24 wants the job's operations to grow with nodes, not ranks.

    .venv/bin/python benchmarks/fs_ops.py [--quick]
    .venv/bin/python benchmarks/run.py --only fs_ops

Needs ``strace`` (Debian: ``apt-get install strace``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import Row

RANKS = 8
SECONDS = 10.0
WARMUP_S = 3.0
SYSCALLS = (
    "openat,write,pwrite64,newfstatat,statx,fstat,lstat,rename,renameat2,unlink,unlinkat,"
    "ftruncate,fsync,fdatasync,getdents64,mkdir,mkdirat,link,linkat"
)
WORKER = """
import os, sys, time
import torch, torch.distributed as dist
import ckptdash
if sys.argv[2] == "per-rank":
    os.environ.pop("LOCAL_RANK", None)   # a launcher that names no local ranks
dist.init_process_group("gloo")
saving = sys.argv[3] == "saving"
with ckptdash.Monitor(sys.argv[1], pulse_interval_s=1.0, agree_interval_s=1.0,
                      heartbeat_interval_s=10.0) as monitor:
    start, step, last_save = time.time(), 0, time.time()
    while time.time() - start < float(sys.argv[4]):
        time.sleep(0.05)
        monitor.step(step)
        if saving and time.time() - last_save >= 2.0:
            monitor.save({"w": torch.zeros(16), "step": step})
            last_save = time.time()
        step += 1
"""


def count_ops(mode: str, case: str, seconds: float) -> tuple[float, dict[str, int]]:
    """Operations per second on the run directory, and their count by system call."""
    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-fsops-") as tmp:
        run, trace, script = Path(tmp, "run"), Path(tmp, "trace"), Path(tmp, "worker.py")
        script.write_text(WORKER)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        argv = ["strace", "-f", "-y", "-qq", "-ttt", "-e", f"trace={SYSCALLS}", "-o", str(trace)]
        argv += [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        argv += [f"--nproc-per-node={RANKS}", str(script), str(run), mode, case, str(seconds)]
        subprocess.run(argv, env=env, check=True, capture_output=True, timeout=600)
        where = str(run)
        calls: list[tuple[float, str]] = []
        for line in trace.read_text(errors="replace").splitlines():
            m = re.match(r"^\d+\s+([\d.]+)\s+(\w+)\(", line)
            if m and where in line:
                calls.append((float(m[1]), m[2]))
        # The steady state only: from WARMUP_S after the job's first operation on the run (start
        # up: run.json, event files, recovery) to a second before its last (shutting down).
        first, last = calls[0][0] + WARMUP_S, calls[-1][0] - 1.0
        counts: dict[str, int] = {}
        for t, name in calls:
            if first <= t <= last:
                counts[name] = counts.get(name, 0) + 1
        return sum(counts.values()) / max(1e-9, last - first), counts


def run(quick: bool = False) -> list[Row]:
    if shutil.which("strace") is None:
        return [Row("job filesystem operations", "skipped: install strace", "—", None)]
    seconds = 7.0 if quick else SECONDS
    rows = []
    for case in ("idle", "saving"):
        node, node_counts = count_ops("node", case, seconds)
        per_rank, _ = count_ops("per-rank", case, seconds)
        top = ", ".join(f"{k} {v}" for k, v in sorted(node_counts.items(), key=lambda kv: -kv[1]))
        rows.append(
            Row(
                f"job: filesystem operations on the run directory per second, {RANKS} ranks on one"
                f" node, {case} (steady state of {seconds:.0f} s under strace; by call: {top})",
                f"{node:.1f} /s (one pulse file for the node)",
                f"{per_rank:.1f} /s (a pulse record per rank)",
                node / per_rank if per_rank else None,
            )
        )
    return rows


if __name__ == "__main__":
    from timing import table

    print(table(run("--quick" in sys.argv)))
