"""The owner's training job in the group-folder tests, one real process over several runs.

    python -m tests.security.group_child STEPS RUN_DIR [RUN_DIR ...]

For each run it starts an attempt (loading what the resume rule chooses), trains STEPS steps,
checking the inbox at every step and saving whenever ckptdash asks, and ends the attempt.
It prints one JSON line per run ({"run", "loaded", "attempt"}); exit status 0 means every run
survived whatever the group put in it.
"""

from __future__ import annotations

import json
import sys

from ckptdash import Monitor


def main() -> int:
    steps = int(sys.argv[1])
    for run_dir in sys.argv[2:]:
        with Monitor(
            run_dir, install_signals=False, poll_interval_s=0.001, agree_interval_s=0.001
        ) as monitor:
            state = monitor.load()
            start = state["step"] + 1 if state else 1
            for step in range(start, start + steps):
                monitor.step(step)
                if monitor.should_save or step in (start, start + steps - 1):
                    monitor.save({"step": step})
                if monitor.should_stop:
                    break
            attempt = monitor.session.attempt
        loaded = None if state is None else state["step"]
        print(json.dumps({"run": run_dir, "loaded": loaded, "attempt": attempt}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
