"""A tiny training loop with ckptdash.Monitor, run as its own process by the security tests.

    python -m tests.security.train_child RUN_DIR [MAX_SECONDS]

It trains (a few ms per step) until a command stops it or MAX_SECONDS pass, saving whenever
ckptdash asks; exit status 0 means training survived whatever was in the run directory.
"""

from __future__ import annotations

import sys
import time

from ckptdash import Monitor


def main() -> int:
    run_dir = sys.argv[1]
    deadline = time.monotonic() + float(sys.argv[2] if len(sys.argv) > 2 else 30)
    with Monitor(
        run_dir, poll_interval_s=0.02, agree_interval_s=0.01, heartbeat_interval_s=1.0
    ) as monitor:
        state = monitor.load()
        step = state["step"] + 1 if state else 0
        while time.monotonic() < deadline:
            time.sleep(0.002)  # the "work" of one step
            monitor.step(step)
            if monitor.should_save:
                monitor.save({"step": step})
            if monitor.should_stop:
                return 0
            step += 1
    return 3  # never stopped by a command


if __name__ == "__main__":
    sys.exit(main())
