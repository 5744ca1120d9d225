"""Goodput and badput by cause, with exact numbers, on runs written by hand as JSON lines in the
documented format (docs/format.md) — the way another tool would write them — and read back
through the CLI, the notebook function and the run state (definitions: docs/goodput.md)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

import ckptdash
from ckptdash.analysis import goodput
from ckptdash.cli import main
from ckptdash.state import RunState
from ckptdash.state.reading import load_state
from ckptdash.tail import RunTailer

T0 = 1_764_430_000.0
CAUSES = ["startup", "saving", "lost_work", "requeue_wait", "other"]


def line(
    kind: str, t: float, attempt: int = 0, rank: int = 0, step: int | None = None, **f: Any
) -> dict[str, Any]:
    return {
        "kind": kind,
        "v": 1,
        "t": T0 + t,
        "run": "r1",
        "attempt": attempt,
        "rank": rank,
        "host": f"n{attempt}",
        "step": step,
        **f,
    }


def save(t: float, step: int, duration: float, attempt: int = 0, **f: Any) -> dict[str, Any]:
    fields = {
        "path": f"/ck/step={step}.ckpt",
        "trigger": "periodic",
        "size_bytes": 10,
        "duration_s": duration,
        **f,
    }
    return line("checkpoint_saved", t, attempt, step=step, **fields)


def write_run(root: Path, lines: list[dict[str, Any]]) -> Path:
    """One JSONL file per (attempt, rank), named as the format says; the run declared its
    /ck folder, so its checkpoints there count (docs/format.md, *Which records count*)."""
    (root / "events").mkdir(parents=True)
    lines = [line("checkpoint_dir_declared", 0, 0, step=None, path="/ck"), *lines]
    for key in sorted({(x["attempt"], x["rank"]) for x in lines}):
        name = root / "events" / f"A{key[0]:04d}.R{key[1]:04d}.n{key[0]}.1.jsonl"
        name.write_text(
            "".join(json.dumps(x) + "\n" for x in lines if (x["attempt"], x["rank"]) == key)
        )
    return root


# Attempt 0 is killed without warning (no run_finished); attempt 1 waits in the queue,
# resumes and completes.
KILLED = [
    line("run_started", 0, scheduler="slurm", job_id="7"),
    line("heartbeat", 20, step=1, metrics={"loss": 2.0}),
    save(100, 100, 4.0),
    save(200, 200, 4.0),
    line("heartbeat", 290, step=290),
    line("run_started", 400, 1, scheduler="slurm", job_id="7"),
    line("run_resumed", 410, 1, step=200, path="/ck/step=200.ckpt", reason="newest"),
    line("heartbeat", 430, 1, step=201),
    save(590, 500, 5.0, 1, trigger="final"),
    line("run_finished", 600, 1, step=500, reason="completed"),
]

# Attempt 0 saves asynchronously (blocking 0.5 s of a 4 s save), gets SIGUSR2, saves (3 s),
# requeues and stops; attempt 1 starts 815 s later, resumes and completes.
SIGNALLED = [
    line("run_started", 0),
    line("heartbeat", 30, step=1),
    save(100, 100, 4.0, blocking_s=0.5),
    line("heartbeat", 150, step=150),
    line("signal_received", 180, step=180, signal="SIGUSR2", action="requeue"),
    save(183, 180, 3.0, trigger="signal"),
    line("requeue_issued", 184, step=180, job_id="7", command="scontrol requeue 7"),
    line("run_finished", 185, step=180, reason="preempted"),
    line("run_started", 1000, 1),
    line("run_resumed", 1010, 1, step=180, path="/ck/step=180.ckpt", reason="newest"),
    line("heartbeat", 1040, 1, step=181),
    save(1500, 600, 5.0, 1, trigger="final"),
    line("run_finished", 1502, 1, step=600, reason="completed"),
]


def causes(d: dict[str, Any]) -> list[float]:
    return [d["badput_s"][c] for c in CAUSES]


def test_a_kill_without_warning_loses_the_work_since_the_last_save(tmp_path: Path) -> None:
    """Killed at its last event (290 s) with the last durable save at 200 s: 90 s of lost work;
    its end to the next run_started is queue; each attempt's start to first heartbeat is
    startup; the rows add up to the run."""
    g = ckptdash.goodput(write_run(tmp_path / "run", KILLED), now=T0 + 10_000).to_dict()
    a0, a1 = g["attempts"]
    assert (a0["outcome"], a0["wall_s"], a0["productive_s"]) == ("lost", 400.0, 172.0)
    assert causes(a0) == [20.0, 8.0, 90.0, 110.0, 0.0]
    assert (a1["outcome"], a1["wall_s"], a1["productive_s"]) == ("finished", 200.0, 165.0)
    assert causes(a1) == [30.0, 5.0, 0.0, 0.0, 0.0]
    assert (g["wall_s"], g["productive_s"], g["goodput"]) == (600.0, 337.0, 0.561667)
    assert causes(g) == [50.0, 13.0, 90.0, 110.0, 0.0]
    assert g["running"] is False


def test_a_signal_save_loses_almost_nothing_and_async_saves_count_their_stall(
    tmp_path: Path,
) -> None:
    """A preemption caught by a signal save loses only save → end (2 s); the async save counts
    its blocking_s (0.5 s), not its 4 s duration; the 815 s in the queue is requeue_wait."""
    g = goodput.goodput(write_run(tmp_path / "run", SIGNALLED)).to_dict()
    a0, a1 = g["attempts"]
    assert causes(a0) == [30.0, 3.5, 2.0, 815.0, 0.0]
    assert (a0["wall_s"], a0["productive_s"], a0["goodput"]) == (1000.0, 149.5, 0.1495)
    assert causes(a1) == [40.0, 5.0, 0.0, 0.0, 0.0]
    assert (a1["wall_s"], a1["productive_s"], a1["goodput"]) == (502.0, 457.0, 0.910359)
    assert causes(g) == [70.0, 8.5, 2.0, 815.0, 0.0]
    assert (g["wall_s"], g["productive_s"], g["goodput"]) == (1502.0, 606.5, 0.403795)


def test_a_finished_run_started_again_an_hour_later_is_idle_not_requeue_wait(
    tmp_path: Path,
) -> None:
    """A run that completed and was launched again an hour later (a second demo in the same
    folder, a new job on a finished run): the hour between is "idle between launches", in
    neither the badput nor the wall time, so the first launch's goodput stays what it was and
    `ckptdash goodput` says where the hour went."""
    first = KILLED
    again = [
        line("run_started", 4600, 2),
        line("run_resumed", 4605, 2, step=500, path="/ck/step=500.ckpt", reason="newest"),
        line("run_finished", 4610, 2, step=500, reason="completed"),
    ]
    before = ckptdash.goodput(write_run(tmp_path / "once", first), now=T0 + 9_000).to_dict()
    g = ckptdash.goodput(write_run(tmp_path / "twice", [*first, *again]), now=T0 + 9_000)
    d = g.to_dict()
    assert d["idle_between_launches_s"] == 4000.0
    assert d["badput_s"]["requeue_wait"] == before["badput_s"]["requeue_wait"] == 110.0
    a1 = d["attempts"][1]
    assert (a1["wall_s"], a1["badput_s"]["requeue_wait"]) == (200.0, 0.0)
    assert d["wall_s"] == before["wall_s"] + 10.0  # only the second launch's own 10 s
    assert d["goodput"] == pytest.approx(before["goodput"], abs=0.01)
    assert sum(a["wall_s"] for a in d["attempts"]) == d["wall_s"]
    assert "idle between launches 1 h 06 min" in goodput.render(g)


def test_a_running_attempt_counts_to_now_until_it_goes_silent() -> None:
    """While the newest attempt writes, the wall time ends now and nothing is lost yet; silent
    for longer than stale_after_s it is counted to its last event only ("stale")."""
    state = RunState("/r", "r1")
    rows = [
        line("run_started", 0),
        line("heartbeat", 10, step=1),
        save(60, 50, 2.0),
        line("heartbeat", 100, step=90),
    ]
    state.apply_events(_decode(rows))
    live = goodput.of_state(state, now=T0 + 130)
    assert (live.running, live.wall_s, live.productive_s) == (True, 130.0, 118.0)
    assert live.attempts[0].outcome == "running"
    assert live.badput == goodput.Badput(startup=10.0, saving=2.0)
    stale = goodput.of_state(state, now=T0 + 100 + goodput.STALE_AFTER_S + 1)
    assert (stale.running, stale.wall_s, stale.attempts[0].outcome) == (False, 100.0, "stale")
    assert stale.badput.lost_work == 0.0


def test_an_attempt_refused_by_the_one_job_check_is_other_and_not_in_the_totals() -> None:
    """A second job refused while the first trains is listed with its life as ``other``; it ran
    beside the attempt that held the run, so the run's totals do not count it."""
    state = RunState("/r", "r1")
    rows = [
        line("run_started", 0),
        line("heartbeat", 10, step=1),
        save(60, 50, 2.0),
        line("heartbeat", 100, step=90),
        line("run_started", 50, 1),
        line("run_failed", 51.5, 1, error="refused to start: attempt 0 on n0 is alive"),
    ]
    state.apply_events(_decode(rows))
    g = goodput.of_state(state, now=T0 + 130)
    first, refused = g.attempts
    assert (refused.attempt, refused.outcome, refused.wall_s) == (1, "refused", 1.5)
    assert refused.badput == goodput.Badput(other=1.5)
    assert (first.outcome, first.productive_s) == ("running", 118.0)
    assert (g.wall_s, g.productive_s, g.badput.other) == (130.0, 118.0, 0.0)


def test_ranks_save_in_parallel_so_the_slowest_ranks_saving_counts() -> None:
    """Saving is per rank the sum of its saves, and the attempt's is the largest rank's (ranks
    save at once; each rank's saves follow one another). The first step is any rank's."""
    rows = [
        line("run_started", 0),
        line("heartbeat", 5, rank=1, step=1),
        line("heartbeat", 6, step=1),
        save(100, 100, 4.0),
        save(100, 100, 6.0, rank=1) | {"path": "/ck/r1"},
        save(200, 200, 4.0),
        line("run_finished", 300, step=300),
    ]
    state = RunState("/r", "r1")
    state.apply_events(_decode(rows))
    g = goodput.of_state(state)
    assert g.badput == goodput.Badput(startup=5.0, saving=8.0)
    assert (g.wall_s, g.productive_s) == (300.0, 287.0)


def test_the_numbers_do_not_depend_on_the_order_events_are_read_in(tmp_path: Path) -> None:
    """Shuffled events (a live tailer sees files grow in any order) give the same numbers as
    replaying the directory."""
    root = write_run(tmp_path / "run", [*KILLED, save(250, 250, 0.1), save(260, 260, 0.2)])
    expected = goodput.of_state(load_state(root), now=T0).to_dict()
    evs = [e for b in RunTailer(root).batches() for e in b.events]
    for seed in range(5):
        random.Random(seed).shuffle(evs)
        state = RunState(str(root), expected["run_id"])
        for i in range(0, len(evs), 3):
            state.apply_events(evs[i : i + 3])
        assert goodput.of_state(state, now=T0).to_dict() == expected


def test_cli_json_has_exactly_the_documented_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ckptdash goodput RUN --json` prints the run's numbers under the documented keys; a
    folder of runs gives one row per run."""
    run = write_run(tmp_path / "runs" / "a", KILLED)
    write_run(tmp_path / "runs" / "b", SIGNALLED)
    assert main(["goodput", str(run), "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert set(one) == {
        "run",
        "run_id",
        "running",
        "wall_s",
        "productive_s",
        "goodput",
        "badput_s",
        "attempts",
        "idle_between_launches_s",
        "preemption",
    }
    assert set(one["preemption"]) == {
        "preemptions",
        "without_signal",
        "lost_s",
        "save_cost_s",
        "interval_s",
        "mtbf_s",
        "young_s",
        "daly_s",
    }
    assert list(one["badput_s"]) == CAUSES
    assert set(one["attempts"][0]) == {
        "attempt",
        "outcome",
        "started_at",
        "ended_at",
        "wall_s",
        "productive_s",
        "goodput",
        "badput_s",
    }
    assert one["goodput"] == 0.561667
    assert main(["goodput", str(tmp_path / "runs"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["runs"]
    assert [(Path(r["run"]).name, r["goodput"]) for r in rows] == [("a", 0.561667), ("b", 0.403795)]


def test_cli_text_names_every_cause_and_each_attempt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The readable form says the goodput, each cause and one line per attempt."""
    assert main(["goodput", str(write_run(tmp_path / "run", SIGNALLED))]) == 0
    out = capsys.readouterr().out
    assert "goodput 40.4 %: productive 10 min 06 s of 25 min 02 s wall" in out
    assert "requeue wait 13 min 35 s" in out
    assert [ln.split()[:2] for ln in out.splitlines()[-2:]] == [["0", "stopped"], ["1", "finished"]]


def test_a_run_without_attempts_has_no_goodput_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run directory with no events yet: wall 0, goodput null, and the text says so."""
    (tmp_path / "run" / "events").mkdir(parents=True)
    assert main(["goodput", str(tmp_path / "run"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["wall_s"], d["goodput"], d["attempts"]) == (0.0, None, [])
    assert main(["goodput", str(tmp_path / "run")]) == 0
    assert "goodput -: productive 0.0 s of 0.0 s wall" in capsys.readouterr().out


def _decode(rows: list[dict[str, Any]]) -> list[Any]:
    from ckptdash.events import decode_lines

    return decode_lines("".join(json.dumps(r) + "\n" for r in rows).encode())


def test_goodput_gives_the_preemption_cost_and_interval_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What a preemption cost and the Young/Daly interval, which only the dashboard showed, are
    printed by `ckptdash goodput` and returned by `ckptdash.goodput()` with the same figures."""
    import ckptdash

    run = write_run(tmp_path / "run", SIGNALLED)
    g = ckptdash.goodput(run)
    assert g.preemption is not None
    assert len(g.preemption.preemptions) == 1
    assert main(["goodput", str(run)]) == 0
    out = capsys.readouterr().out
    assert "preemptions: 1, work lost" in out
    assert "checkpoint interval" in out
