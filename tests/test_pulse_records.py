"""Every rank's liveness in one fixed-size record (issue 24: bounded history for liveness):
the log grows with events, not with ranks × seconds, and every reader still sees each rank
alive, at its step, and for how long it stood still — also a reader that opens the run late."""

from __future__ import annotations

import os
import time
import zlib
from pathlib import Path

import ckptdash
from ckptdash.analysis import health
from ckptdash.events import RunStarted, decode_lines
from ckptdash.rundir import RunDir
from ckptdash.rundir.pulses import (
    PULSES_DIR,
    RECORD_BYTES,
    TORN,
    PulseRecord,
    PulseRecordWriter,
    decode,
    encode,
    record_name,
)
from ckptdash.rundir.writer import EventWriter
from ckptdash.state.reading import load_state, new_state
from ckptdash.tail import RunTailer
from ckptdash.train.health.pulse import Pulser
from tests.conftest import WaitUntil


def started(run: Path, rank: int = 0) -> str:
    """A run whose attempt 0 rank ``rank`` has started; returns its run id."""
    with EventWriter(RunDir(run), attempt=0, rank=rank, host="n1") as w:
        w.emit(RunStarted, scheduler="local")
        return w.run_id


def log_pulses(run: Path) -> int:
    """How many pulse lines the run's event files themselves hold."""
    files = RunDir(run).event_files()
    return sum(1 for p in files for e in decode_lines(p.read_bytes()) if e.KIND == "pulse")


def test_a_record_is_one_fixed_size_line_and_a_torn_one_is_refused() -> None:
    """A record is RECORD_BYTES long whatever its values; flipping a byte or mixing an old and
    a new record (a rewrite read half-way) fails its checksum instead of giving a mixed pulse."""
    old = PulseRecord("r1", 0, 3, "n1", 42, 1_764_430_000.25, 7, 1_764_429_990.0, 1)
    new = PulseRecord("r1", 0, 3, "n1", 42, 1_764_430_001.5, 8, 1_764_430_001.5, 2)
    a, b = encode(old), encode(new)
    assert len(a) == len(b) == RECORD_BYTES and a.endswith(b"\n")
    assert decode(a) == old and decode(b) == new
    cut = a.index(b'"step"')  # the old time, the new step and checksum
    assert decode(a[:cut] + b[cut:]) == TORN
    assert decode(b"{" * 5000) == TORN  # no recursion blow-up on hostile bytes
    assert decode(a.replace(b'"v":1', b'"v":9')) == TORN  # its checksum no longer matches
    later = b'{"v":2,"run":"r1"}'  # a later format, whole: said, not taken for a tear
    assert decode(later[:-1] + b',"crc":"%08x"}' % zlib.crc32(later)) == ("format version 2, not 1")


def test_a_job_pulsing_for_seconds_adds_one_pulse_to_its_log(
    tmp_path: Path, wait_until: WaitUntil
) -> None:
    """A real Monitor pulsing 50 times a second: its record follows the step, its event files do
    not grow while it only pulses, and ``ckptdash status``'s state sees the rank at its step."""
    run = tmp_path / "run"
    with ckptdash.Monitor(run, pulse_interval_s=0.02, heartbeat_interval_s=3600) as monitor:
        monitor.step(5)
        record = run / PULSES_DIR / record_name(0, 0)
        wait_until(lambda: b'"step":5' in record.read_bytes(), what="the record at step 5")
        sizes = sum(p.stat().st_size for p in RunDir(run).event_files())
        time.sleep(0.5)  # 25 pulses
        assert sum(p.stat().st_size for p in RunDir(run).event_files()) == sizes
        assert record.stat().st_size == RECORD_BYTES
        state = load_state(run)
        (r0,) = state.rank_info(0)
        assert r0.step == 5 and r0.pulses
        assert r0.last_seen is not None and time.time() - r0.last_seen < 5
    assert log_pulses(run) == 1


def test_a_reader_that_opens_late_sees_how_long_a_rank_stood_still(tmp_path: Path) -> None:
    """A rank at step 30 for 10 minutes, still pulsing: a reader opening the run now (the log
    has one pulse, from long ago) sees it hung for 10 minutes, as it would from every pulse."""
    run = tmp_path / "run"
    run_id = started(run)
    now = time.time()
    w = PulseRecordWriter(run, run=run_id, attempt=0, rank=0, host="n1")
    w.write(t=now, step=30, since=now - 600)
    w.close()
    state = load_state(run)
    (r0,) = state.rank_info(0)
    assert (r0.step, r0.step_since, r0.last_seen) == (30, now - 600, now)
    alerts = {a.kind: a for a in health.detect(state, health.Thresholds(), now)}
    assert "hung" in alerts and "for 600 s" in alerts["hung"].detail


def test_a_follower_reads_only_records_that_changed(tmp_path: Path) -> None:
    """A poll reads a record again only after it was rewritten: 64 idle ranks cost a listing."""
    run = tmp_path / "run"
    run_id = started(run)
    writers = [PulseRecordWriter(run, run=run_id, attempt=0, rank=r, host="n1") for r in range(64)]
    for w in writers:
        w.write(t=time.time(), step=1, since=time.time())
    tailer = RunTailer(RunDir(run))
    first = [e for b in tailer.batches() for e in b.pulses]
    assert len(first) == 128  # two per record: since and now
    assert [e for b in tailer.batches() for e in b.pulses] == []
    writers[7].write(t=time.time(), step=2, since=time.time())
    again = [e for b in tailer.batches() for e in b.pulses]
    assert {(e.rank, e.step) for e in again} == {(7, 2)}
    for w in writers:
        w.close()


def test_planted_and_broken_records_never_count(tmp_path: Path) -> None:
    """A record linked elsewhere, a FIFO, another run's record, one whose name lies about its
    rank, a huge file and garbage: none makes a rank look alive; each is one invalid line."""
    run = tmp_path / "run"
    run_id = started(run)
    folder = run / PULSES_DIR
    folder.mkdir(exist_ok=True)
    now = time.time()
    good = encode(PulseRecord(run_id, 0, 1, "n1", 1, now, 3, now, 1))
    target = tmp_path / "elsewhere.json"
    target.write_bytes(good)
    (folder / record_name(0, 1)).symlink_to(target)
    os.mkfifo(folder / record_name(0, 2))
    (folder / record_name(0, 3)).write_bytes(
        encode(PulseRecord("other", 0, 3, "n1", 1, now, 3, now, 1))
    )
    (folder / record_name(0, 4)).write_bytes(good)  # says rank 1
    (folder / record_name(0, 5)).write_bytes(good * 3)
    (folder / record_name(0, 6)).write_bytes(b"\x00" * RECORD_BYTES)
    tailer = RunTailer(RunDir(run))
    state = new_state(RunDir(run))
    for _ in range(2):  # garbage is taken for a rewrite once, then reported
        for b in tailer.batches():
            state.apply(b)
    assert [r.rank for r in state.rank_info(0)] == [0]
    assert state.bad_lines.counts.get("invalid") == 6


def test_the_log_of_many_ranks_grows_with_events_not_seconds(tmp_path: Path) -> None:
    """Eight ranks' pulsers ticking 200 times each (the clock moving 1 s a tick): 200 seconds of
    pulses add 4 pulse lines per rank to the log (one a minute), not 200."""
    run, ranks = tmp_path / "run", 8
    started(run)
    clock = [0.0]
    for rank in range(ranks):
        with EventWriter(RunDir(run), attempt=0, rank=rank, host="n1") as w:
            step = lambda: int(clock[0]) // 10  # noqa: E731  # a new step every 10 s
            p = Pulser(step, w, period_s=1.0, hung_after_s=0, clock=lambda: clock[0])
            for tick in range(200):
                clock[0] = float(tick)
                p.tick()
            p.stop()
    assert log_pulses(run) == ranks * 4  # at 0, 60, 120 and 180 s
    assert [r.step for r in load_state(run).rank_info(0)] == [19] * ranks
