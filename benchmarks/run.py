"""Run every ckptdash benchmark and print one markdown table (also benchmarks/out/results.md).

    .venv/bin/python benchmarks/run.py            # the full suite (a few minutes)
    .venv/bin/python benchmarks/run.py --quick    # a smoke version (under a minute)
    .venv/bin/python benchmarks/run.py --only ingest --only save_cost
    .venv/bin/python benchmarks/run.py --only scale --full   # + the 24 h runs (GBs, an hour)

Each figure is measured against its baseline in the same run, the two taking
turns; ``ratio`` is always the ckptdash figure divided by the baseline's.
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from timing import Row, table

# Module names, imported only when chosen (and never again in the agreement's spawned ranks,
# which re-import this file).
BENCHMARKS = (
    "ingest",
    "step_overhead",
    "save_cost",
    "async_save",
    "agreement",
    "dash_latency",
    "validate_dir",
    "hf_step_overhead",
    "idle_watch",
    "inbox_flood",
    "scale",
    "fs_ops",
)
# Benchmarks that take --device (the others measure the CPU side only).
ON_DEVICE = ("async_save",)
# Benchmarks with sizes too big for the default run (GBs of generated data): only with --full.
TAKES_FULL = ("scale",)
OUT = Path(__file__).resolve().parent / "out"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer repetitions")
    parser.add_argument(
        "--full",
        action="store_true",
        help=f"also the biggest sizes of {', '.join(TAKES_FULL)} (GBs of generated data)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=sorted(BENCHMARKS),
        metavar="NAME",
        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where async_save puts its tensors: cpu (the default, what CI runs) or cuda",
    )
    args = parser.parse_args(argv)
    chosen = args.only or list(BENCHMARKS)
    load_before = os.getloadavg()[0]
    began = time.perf_counter()
    rows: list[Row] = []
    failed: list[str] = []
    for name in BENCHMARKS:
        if name in chosen:
            start = time.perf_counter()
            print(f"running {name} …", file=sys.stderr, flush=True)
            try:
                bench: Callable[..., list[Row]] = importlib.import_module(name).run
                extra: dict[str, object] = {"device": args.device} if name in ON_DEVICE else {}
                if name in TAKES_FULL:
                    extra["full"] = args.full
                rows.extend(bench(args.quick, **extra))
            except Exception as exc:  # one broken benchmark must not lose the others' figures
                traceback.print_exc()
                failed.append(name)
                error = f"{type(exc).__name__}: {exc}".splitlines()[0][:160].replace("|", "/")
                rows.append(Row(f"{name}: FAILED", error, "", None, "runs", False))
            print(f"  {name}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    wall = time.perf_counter() - began
    mode = "quick" if args.quick else "full"
    header = (
        f"ckptdash benchmarks ({mode}; {', '.join(chosen)}): {wall:.0f} s wall,"
        f" {os.cpu_count()} CPUs (1-min load average {load_before:.1f} before,"
        f" {os.getloadavg()[0]:.1f} after), Python {platform.python_version()},"
        f" torch {version('torch')}."
        " ratio = ckptdash ÷ baseline; ✅/❌ = goal met/missed."
    )
    text = f"{header}\n\n{table(rows)}\n"
    print(text)
    OUT.mkdir(exist_ok=True)
    (OUT / "results.md").write_text(text)
    if failed:
        print(f"failed: {', '.join(failed)} (tracebacks above)", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
