"""``ckptdash watch``: alerts fire once as they begin and end, reach --exec and --webhook, rules
act through SLURM's commands, and all of it is written into the run (ckptdash.ops.watch)."""

from __future__ import annotations

import http.server
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from ckptdash import cli, control
from ckptdash import events as ev
from ckptdash.analysis import health
from ckptdash.errors import CkptDashError
from ckptdash.ops.watch import Watch, Webhook, act, parse_rules
from ckptdash.rundir import RunDir
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.reading import load_state
from tests.conftest import WaitUntil

T0 = 1_764_430_000.0


class FakeSlurm:
    """A stand-in for scontrol/scancel that records every call and answers ``show job``."""

    def __init__(self, state: str = "RUNNING", user: str = "") -> None:
        self.state = state
        self.user = user or f"me({os.geteuid()})"  # UserId: the job's owner, as SLURM says
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> tuple[int, str]:
        self.calls.append(list(argv))
        if argv[:3] == ["scontrol", "show", "job"]:
            reason = "JobHeldUser" if self.state == "HELD" else "None"
            state = "PENDING" if self.state == "HELD" else self.state
            return 0, (
                f"JobId={argv[-1]} UserId={self.user} JobState={state} Reason={reason}"
                " Requeue=1 Restarts=3"
            )
        if argv[:2] == ["scontrol", "hold"] or argv[:2] == ["scontrol", "requeuehold"]:
            self.state = "HELD"
        return 0, ""

    def actions(self) -> list[list[str]]:
        return [c for c in self.calls if c[:3] != ["scontrol", "show", "job"]]


def write(run: RunDir, attempt: int, *items: tuple[type[ev.Event], float, dict[str, Any]]) -> None:
    with EventWriter(run, attempt=attempt, rank=0, host="node1") as w:
        for cls, t, fields in items:
            w.emit(cls, t=T0 + t, **fields)


def hung_run(run: RunDir) -> None:
    """Attempt 0 of SLURM job 77 steps to 20 by t=20, then pulses at step 20 up to t=100."""
    start = (ev.RunStarted, 0.0, {"scheduler": "slurm", "job_id": "77"})
    pulses = [(ev.Pulse, float(i), {"step": min(i, 20)}) for i in range(1, 101)]
    write(run, 0, start, *pulses)


class Hooks:
    """A local webhook endpoint (fails the first ``fail`` posts with 500) and an exec log."""

    def __init__(self, tmp: Path, fail: int = 0) -> None:
        self.posts: list[dict[str, Any]] = []
        self.times: list[float] = []
        self.fail = fail
        hooks = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if hooks.fail > 0:
                    hooks.fail -= 1
                    self.send_response(500)
                else:
                    hooks.posts.append(json.loads(body))
                    hooks.times.append(time.monotonic())
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.exec_log = tmp / "exec.jsonl"
        self.exec_cmd = f"cat >> {self.exec_log}"

    def executed(self) -> list[dict[str, Any]]:
        if not self.exec_log.exists():
            return []
        return [json.loads(line) for line in self.exec_log.read_text().splitlines()]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hooks(tmp_path: Path) -> Iterator[Hooks]:
    h = Hooks(tmp_path)
    yield h
    h.close()


def test_hung_fires_once_requeues_and_clears_with_the_next_attempt(
    run_dir: RunDir, hooks: Hooks, wait_until: WaitUntil
) -> None:
    """A run stuck at step 20: the first look raises hung once (exec and webhook get the JSON,
    `scontrol requeue 77` runs, alert_raised and action_taken are in the run); a second look
    fires nothing; once attempt 1 starts, hung clears once, also recorded."""
    hung_run(run_dir)
    slurm = FakeSlurm()
    now = [T0 + 100]
    watch = Watch(
        run_dir.root,
        overrides={"hung_after_s": 60},
        exec_cmd=hooks.exec_cmd,
        webhook=Webhook(hooks.url),
        rules=parse_rules(["hung=requeue"]),
        runner=slurm,
        clock=lambda: now[0],
    )
    try:
        (fired,) = watch.poll()
        assert (fired.event, fired.alert.kind) == ("raised", "hung")
        assert slurm.actions() == [["scontrol", "requeue", "77"]]
        assert watch.poll() == []
        write(run_dir, 1, (ev.RunStarted, 110.0, {"scheduler": "slurm", "job_id": "77"}))
        now[0] = T0 + 111
        (cleared,) = watch.poll()
        assert (cleared.event, cleared.alert.kind) == ("cleared", "hung")
        wait_until(lambda: len(hooks.posts) == 2, what="two webhook posts")
    finally:
        watch.close()
    assert [(p["event"], p["alert"], p["job_id"]) for p in hooks.posts] == [
        ("raised", "hung", "77"),
        ("cleared", "hung", "77"),
    ]
    assert [p["event"] for p in hooks.executed()] == ["raised", "cleared"]
    log = load_state(run_dir).alert_log
    assert [(x.event, x.alert) for x in log] == [
        ("alert_raised", "hung"),
        ("action_taken", "hung"),
        ("alert_cleared", "hung"),
    ]
    action = log[1]
    assert (action.action, action.command, action.ok) == ("requeue", "scontrol requeue 77", True)
    assert "ckptdash watch" in action.who


def test_a_restarted_watch_does_not_fire_an_open_alert_again(run_dir: RunDir) -> None:
    """The run's log says hung is raised and not cleared: a new watch starts quiet, and alert
    events written by the watch never count as the attempt's sign of life."""
    hung_run(run_dir)
    slurm = FakeSlurm()
    clock = lambda: T0 + 100  # noqa: E731
    first = Watch(run_dir.root, overrides={"hung_after_s": 60}, runner=slurm, clock=clock)
    assert len(first.poll()) == 1
    first.close()
    second = Watch(run_dir.root, overrides={"hung_after_s": 60}, runner=slurm, clock=clock)
    assert second.poll() == []
    second.close()
    assert load_state(run_dir).attempts[0].last_heartbeat_t == T0 + 100


def test_restart_storm_holds_the_job(run_dir: RunDir) -> None:
    """Four attempts that fail at start-up within minutes: restart_storm raised and, with
    --on restart_storm=hold, the pending job is held (scontrol hold), recorded with the result."""
    for a in range(4):
        write(
            run_dir,
            a,
            (ev.RunStarted, a * 30.0, {"scheduler": "slurm", "job_id": "77"}),
            (ev.RunFailed, a * 30.0 + 2, {"error": "ImportError: no module named foo"}),
        )
    slurm = FakeSlurm(state="PENDING")
    watch = Watch(
        run_dir.root,
        rules=parse_rules(["restart_storm=hold"]),
        runner=slurm,
        clock=lambda: T0 + 100,
    )
    fired = {f.alert.kind: f for f in watch.poll()}
    watch.close()
    assert "restart_storm" in fired
    assert slurm.actions() == [["scontrol", "hold", "77"]]
    (action,) = [x for x in load_state(run_dir).alert_log if x.event == "action_taken"]
    assert action.ok and "held" in action.detail


def test_webhook_retries_a_failing_endpoint_and_rate_limits(tmp_path: Path) -> None:
    """Two 500s then success: one delivery. With 2 posts per window, the third post starts only
    once the window since the first has passed."""
    hooks = Hooks(tmp_path, fail=2)
    try:
        hook = Webhook(hooks.url, per_minute=2, window_s=1.0, backoff_s=0.01)
        t0 = time.monotonic()
        for i in range(3):
            hook.post({"alert": "hung", "event": "raised", "n": i})
        hook.close(timeout_s=20)
        assert [p["n"] for p in hooks.posts] == [0, 1, 2]
        assert hooks.times[2] - t0 >= 1.0
        assert hook.failed == 0
    finally:
        hooks.close()


def test_rules_and_urls_are_checked() -> None:
    """A rule outside the allowed pairs, or a webhook that is not http(s), is refused up front."""
    with pytest.raises(CkptDashError, match="hung=requeue"):
        parse_rules(["hung=hold"])
    with pytest.raises(CkptDashError, match="http"):
        Webhook("ftp://x")


def test_status_json_lists_alerts_and_thresholds_come_from_settings_and_flags(
    run_dir: RunDir, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status --json` lists the alerts (kind, since, detail); `ckptdash health --set` stores a
    threshold in the run's settings, and --hung-after on the command line overrides it."""
    start = (ev.RunStarted, time.time() - T0 - 100, {"scheduler": "local"})
    pulses = [(ev.Pulse, time.time() - T0 - 100 + i, {"step": min(i, 3)}) for i in range(100)]
    write(run_dir, 0, start, *pulses)

    def alerts(*flags: str) -> list[str]:
        assert cli.main(["status", str(run_dir.root), "--json", "--no-scheduler", *flags]) == 0
        return [a["kind"] for a in msgspec.json.decode(capsys.readouterr().out)["alerts"]]

    assert alerts() == []  # 97 s at step 3 < 300 s
    assert cli.main(["health", str(run_dir.root), "--set", "hung_after_s=60"]) == 0
    assert control.read_settings(run_dir).health == {"hung_after_s": 60.0}
    assert "ALERT hung" in capsys.readouterr().out
    assert alerts() == ["hung"]
    assert alerts("--hung-after", "500") == []
    assert cli.main(["status", str(run_dir.root), "--threshold", "nope=1"]) == 2
    assert "unknown health threshold 'nope'" in capsys.readouterr().err


def test_watch_command_once_fires_to_exec_and_records(run_dir: RunDir, tmp_path: Path) -> None:
    """`ckptdash watch RUN --once --hung-after 60 --exec CMD` (as cron would run it): the hung
    alert reaches CMD's stdin as JSON and is recorded in the run; a bad rule exits 2."""
    now = time.time()
    write(run_dir, 0, (ev.RunStarted, now - T0 - 100, {"scheduler": "local"}))
    write(run_dir, 0, *[(ev.Pulse, now - T0 - 100 + i, {"step": min(i, 3)}) for i in range(100)])
    out = tmp_path / "alerts.jsonl"
    argv = ["watch", str(run_dir.root), "--once", "--hung-after", "60", "--exec", f"cat > {out}"]
    assert cli.main(argv) == 0
    assert json.loads(out.read_text())["alert"] == "hung"
    assert [x.alert for x in load_state(run_dir).alert_log] == ["hung"]
    assert cli.main(["watch", str(run_dir.root), "--on", "stale=requeue"]) == 2


@pytest.mark.parametrize(
    ("state", "command", "ok"),
    [
        ("RUNNING", ["scontrol", "requeuehold", "77"], True),
        ("PENDING", ["scontrol", "hold", "77"], True),
        ("HELD", None, True),
        ("COMPLETED", None, False),
    ],
)
def test_hold_fits_the_jobs_state(state: str, command: list[str] | None, ok: bool) -> None:
    """restart_storm=hold: a running attempt is requeued held, a pending job held, a held one
    left alone, a finished one reported as not held (never an error)."""
    slurm = FakeSlurm(state)
    _, done, what = act("hold", "77", slurm)
    assert done is ok, what
    assert slurm.actions() == ([command] if command else [])
    if state == "COMPLETED":
        assert "COMPLETED" in what


def test_watch_counts_the_same_checkpoints_as_health(run_dir: RunDir, tmp_path: Path) -> None:
    """A checkpoint recorded outside the run's own folders never counts as progress, for
    ``ckptdash watch`` as for ``ckptdash health``: four attempts fail at start-up, one of them
    recorded a 'save' at step 999 in another user's folder; both raise restart_storm."""
    elsewhere = tmp_path / "elsewhere" / "step=999.ckpt"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(b"x")
    for a in range(4):
        saved = (
            ev.CheckpointSaved,
            a * 30.0 + 1,
            {
                "path": str(elsewhere),
                "trigger": "api",
                "size_bytes": 1,
                "duration_s": 0.0,
                "step": 999,
            },
        )
        write(
            run_dir,
            a,
            (ev.RunStarted, a * 30.0, {"scheduler": "slurm", "job_id": "77"}),
            *([saved] if a == 2 else []),
            (ev.RunFailed, a * 30.0 + 2, {"error": "ImportError: no module named foo"}),
        )
    state = load_state(run_dir)
    assert state.checkpoints[str(elsewhere)].status == "invalid"
    assert "restart_storm" in {a.kind for a in health.detect(state, now=T0 + 100)}
    watch = Watch(run_dir.root, runner=FakeSlurm(state="PENDING"), clock=lambda: T0 + 100)
    fired = {f.alert.kind for f in watch.poll()}
    watch.close()
    assert "restart_storm" in fired


# --- SLURM actions only on the user's own job, started by the run itself ----------------------


def _watch_cancel(root: Path, slurm: FakeSlurm, log: Any) -> Watch:
    return Watch(
        root,
        overrides={"hung_after_s": 60},
        rules=parse_rules(["hung=cancel"]),
        runner=slurm,
        clock=lambda: T0 + 100,
        log=log,
    )


def test_hung_cancel_refuses_another_users_job(run_dir: RunDir, tmp_path: Path) -> None:
    """`watch --on hung=cancel`: SLURM says job 77 runs as another account, so no `scancel`
    runs; the refusal is the recorded action's result and watch's log line."""
    hung_run(run_dir)
    slurm = FakeSlurm(user="alice(4242)")
    out = tmp_path / "watch.log"
    with out.open("w") as log:
        watch = _watch_cancel(run_dir.root, slurm, log)
        try:
            (fired,) = watch.poll()
        finally:
            watch.close()
    assert fired.action is not None
    command, ok, what = fired.action
    assert (command, ok) == ("scancel 77", False)
    assert "belongs to alice (uid 4242)" in what
    assert slurm.actions() == []
    assert "FAILED: slurm job 77 belongs to alice" in out.read_text()
    (taken,) = [r for r in load_state(run_dir).alert_log if r.event == "action_taken"]
    assert not taken.ok


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make files of another uid")
def test_hung_cancel_refuses_a_run_another_account_made(tmp_path: Path) -> None:
    """A group member adds a run to RUNS/ whose hung-looking log names the owner's job 77:
    SLURM says 77 is the owner's (the watching user's), but the run's files belong to the
    member, so `watch RUNS/ --on hung=cancel` runs no scancel and says why; the owner's own
    run in the same folder is still acted on."""
    runs = tmp_path / "RUNS"
    planted = RunDir(runs / "looks-hung")
    planted.ensure()
    hung_run(planted)
    for dirpath, dirnames, filenames in os.walk(planted.root):
        for name in [*dirnames, *filenames]:
            os.chown(os.path.join(dirpath, name), 4242, 4242)
    os.chown(planted.root, 4242, 4242)
    mine = RunDir(runs / "mine")
    mine.ensure()
    write(mine, 0, (ev.RunStarted, 0.0, {"scheduler": "slurm", "job_id": "78"}))
    write(mine, 0, *[(ev.Pulse, float(i), {"step": min(i, 20)}) for i in range(1, 101)])
    slurm = FakeSlurm()
    out = tmp_path / "watch.log"
    with out.open("w") as log:
        watch = _watch_cancel(runs, slurm, log)
        try:
            fired = {f.root.name: f for f in watch.poll()}
        finally:
            watch.close()
    refused = fired["looks-hung"].action
    assert refused is not None
    assert refused[1] is False
    assert "not started by the run" in refused[2]
    assert "belongs to uid 4242" in refused[2]
    assert slurm.actions() == [["scancel", "78"]]
    assert "--on hung=cancel: `scancel 77` FAILED: slurm job 77: not started" in out.read_text()


def test_first_look_at_a_folder_holds_a_piece_of_the_logs_not_all_of_them(
    tmp_path: Path,
) -> None:
    """Opening a folder of runs, watch applies each run's log a piece at a time: its peak
    memory (Python allocations) stays far below the logs' bytes (it held ~2.3x them when the
    tailer joined every run's whole log into one batch first), and it sees every event."""
    import tracemalloc

    from ckptdash._dev.scale_runs import write_run

    # Every pulse in the log (ckptdash 0.1's format): logs big enough to measure pieces by.
    written = [
        write_run(tmp_path / f"run{i}", ranks=16, seconds=900, pulses_in_log=True) for i in range(3)
    ]
    log_bytes = sum(w.bytes for w in written)
    watch = Watch(tmp_path, overrides={"stale_after_s": 1e9})
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        assert watch.poll() == []
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
        watch.close()
    totals = [r.state.events_total for r in watch._runs.values()]
    assert totals == [w.lines for w in written]
    assert peak < 0.5 * log_bytes, f"peak {peak / 1e6:.1f} MB for {log_bytes / 1e6:.1f} MB of log"
