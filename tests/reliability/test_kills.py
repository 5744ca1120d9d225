"""kill -9 at random moments: during 50 MB checkpoint saves, event writes and command claims.

Real processes (forked from a forkserver with torch preloaded), real ``SIGKILL``.
The CI sample is 20 save kills and 100 crashes; ``CKPTDASH_LONG=1`` (or
``benchmarks/faults.py``) runs 100 and 300. Each run prints its seed;
``CKPTDASH_FAULT_SEED=<seed>`` replays the same delays and commands.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.reliability import faults
from tests.reliability.conftest import scale


def test_kill_9_during_50_mb_saves_never_damages_a_durable_checkpoint(
    tmp_path: Path, figures: Callable[[str, str], None]
) -> None:
    """A job saving 50 MB checkpoints (rotating step files, overwriting last.ckpt) is
    SIGKILLed at random moments, 20 times (100 long). After every kill: every checkpoint
    the log recorded as saved still matches its size and XXH3 checksum unless the log says
    it was removed or replaced; the resume rule and ``ckptdash.resume_path`` name the newest
    checkpoint that really validates, and it loads with ``weights_only=True`` holding the
    recorded step; the log reads with no bad line; the temp file a kill leaves is ignored,
    then removed and named in an event by the next attempt."""
    seed = faults.seed_from_env()
    report = faults.kill_during_saves(tmp_path, kills=scale(20, 100), seed=seed, log=print)
    figures("kill -9 during saves", report.summary())
    assert report.problems == [], f"seed {seed}:\n" + "\n".join(report.problems)
    assert report.kills == scale(20, 100)
    assert report.checkpoint_bytes >= 50 * 10**6
    assert report.in_save >= report.kills // 2, "most kills should land inside a save"
    # Whether a resume choice was right after each kill is in report.problems; this only
    # says the test did load resumes. Kills before the first save is durable have nothing
    # to load, and on a loaded machine more than one can land there.
    assert report.resumes_loaded >= report.kills // 2, "most kills should find one to resume"


def test_kill_9_during_event_writes_and_claims_loses_or_repeats_no_command(
    tmp_path: Path, figures: Callable[[str, str], None]
) -> None:
    """A fast job (claiming every step, heartbeats every 2 ms, small saves) is SIGKILLed
    100 times (300 long) while valid, already-expired and malformed commands keep arriving;
    kills are aimed at start-up (while it answers what earlier kills left), at the running
    job, or at the milliseconds after a claim. After every kill no line of the
    log is bad (a torn last line is never parsed) and no command has a second
    ``command_received``, a second outcome or a second ``command_applied``. After one final
    clean attempt every command has exactly one outcome — malformed ones rejected with the
    reason, expired ones expired, valid ones applied (naming a recorded checkpoint) or
    expired because their claimer died — and every file is in ``control/done/``."""
    seed = faults.seed_from_env()
    report = faults.crash_during_commands(tmp_path, crashes=scale(100, 300), seed=seed, log=print)
    figures("kill -9 during event writes and claims", report.summary())
    assert report.problems == [], f"seed {seed}:\n" + "\n".join(report.problems[:50])
    assert report.crashes == scale(100, 300)
    assert report.orphans_left, "no kill landed between a claim and its answer"
    assert report.outcomes["command_rejected"] == report.malformed
