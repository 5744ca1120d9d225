"""The long variant of the fault-injection tests: many more kills, crashes and raced commands.

    .venv/bin/python benchmarks/faults.py            # 100 save kills, 300 crashes, 1,000 raced
    .venv/bin/python benchmarks/faults.py --kills 20 --crashes 100 --per-issuer 13  # CI sample
    .venv/bin/python benchmarks/faults.py --only saves --seed 1234   # replay one run

The same harness as ``tests/reliability`` (``tests/reliability/faults.py``): real
processes, real SIGKILL at random (seeded) moments, 50 MB checkpoints on the
local disk. Prints one line of figures per loop and every problem found; exits
1 if there was any. The fuzzing's long variant is ``CKPTDASH_LONG=1 pytest
tests/reliability/test_fuzz.py`` (ten times the CI inputs).
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.reliability import faults  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=100, help="SIGKILLs during saves")
    parser.add_argument("--size-mb", type=int, default=50, help="checkpoint size")
    parser.add_argument("--crashes", type=int, default=300, help="SIGKILLs during claims")
    parser.add_argument("--issuers", type=int, default=8, help="concurrent dashboards/CLIs")
    parser.add_argument("--per-issuer", type=int, default=125, help="commands each")
    parser.add_argument("--seed", type=int, default=None, help="replay a run (default: random)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir on local disk)"
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=["saves", "async-saves", "crashes", "race"],
        help="repeatable",
    )
    args = parser.parse_args(argv)
    chosen = args.only or ["saves", "async-saves", "crashes", "race"]
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    print(f"seed {seed} (replay with --seed {seed})", flush=True)
    base = args.dir or Path(tempfile.mkdtemp(prefix="ckptdash-faults-", dir="/var/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    began = time.perf_counter()

    def log(line: str) -> None:
        print(f"  {line}", file=sys.stderr, flush=True)

    if "saves" in chosen:
        saves = faults.kill_during_saves(
            base / "saves", kills=args.kills, seed=seed, size_mb=args.size_mb, log=log
        )
        print(saves.summary(), flush=True)
        problems += saves.problems
    if "async-saves" in chosen:  # kill -9 while save_async persists in the background
        background = faults.kill_during_saves(
            base / "async-saves",
            kills=args.kills,
            seed=seed,
            size_mb=args.size_mb,
            log=log,
            async_save=True,
            max_delay_s=1.5,
        )
        print(background.summary(), flush=True)
        problems += background.problems
    if "crashes" in chosen:
        crashes = faults.crash_during_commands(
            base / "crashes", crashes=args.crashes, seed=seed, log=log
        )
        print(crashes.summary(), flush=True)
        problems += crashes.problems
    if "race" in chosen:
        race = faults.race_commands(base / "race", issuers=args.issuers, per_issuer=args.per_issuer)
        print(race.summary(), flush=True)
        problems += race.problems
    print(f"{time.perf_counter() - began:.0f} s in all; files under {base}")
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
