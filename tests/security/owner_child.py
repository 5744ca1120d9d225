"""The owner's training job in the owner-only tests: one attempt per run, in one process.

    python -m tests.security.owner_child SPEC_JSON

``SPEC_JSON`` is a list of ``{"run": DIR, "record": PATH | null, "loggers": bool, "csv": DIR |
null}``. For each run it starts an attempt (pulses on), loads, trains two steps and saves;
with ``loggers`` it asks ``monitor.loggers`` for the run's MLflow id (the scan of every event
file); with ``record`` it records a checkpoint other code wrote at PATH (``Monitor.record``);
with ``csv`` it runs the Lightning CSV logger's keep-aside and write-back on that version
folder, as a resumed Lightning attempt does. One JSON line per run: ``attempt``, or
``refused`` (the one line a refused start says), and ``record_error``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ckptdash import Monitor
from ckptdash.errors import CkptDashError


def _csv(folder: str) -> None:
    from ckptdash.lightning.loggers import _keep_csv, _rewrite_csv

    metrics = Path(folder) / "metrics.csv"
    _keep_csv(metrics)
    metrics.unlink(missing_ok=True)  # what Lightning's CSV writer does to the file it reopens
    logger = SimpleNamespace(log_dir=folder, experiment=SimpleNamespace(metrics_keys=[]))
    _rewrite_csv(logger, 1, None)


def one(spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"run": spec["run"]}
    try:
        monitor = Monitor(
            spec["run"], install_signals=False, poll_interval_s=0.001, agree_interval_s=0.001
        )
        monitor.__enter__()
    except CkptDashError as exc:
        out["refused"] = str(exc)
        return out
    try:
        state = monitor.load()
        start = state["step"] + 1 if state else 1
        if spec.get("loggers"):
            out["mlflow"] = monitor.loggers.mlflow_run_id
        for step in (start, start + 1):
            monitor.step(step)
            monitor.save({"step": step})
        if spec.get("record"):
            try:
                monitor.record(spec["record"], trigger="manual")
            except CkptDashError as exc:
                out["record_error"] = str(exc)
        if spec.get("csv"):
            _csv(spec["csv"])
        out["attempt"] = monitor.session.attempt
    finally:
        monitor.__exit__(None, None, None)
    return out


def main() -> int:
    for spec in json.loads(sys.argv[1]):
        print(json.dumps(one(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
