# ruff: noqa: E402  (the tier is skipped, or failed in CI, before deepspeed is imported)
"""DeepSpeed on 2 gloo ranks (CPU, ``DS_ACCELERATOR=cpu``): plain engines through
ckptdash.deepspeed (ZeRO-1 preempted, ZeRO-2 killed while saving) and Lightning's
DeepSpeedStrategy (ZeRO-2): one save per signal, a killed save skipped, the resume loads the
rule's choice.

Cost: each torchrun launch is ~10 s of start-up a rank on 2 idle cores (torch, DeepSpeed,
Lightning); so one stage per scenario, both plain runs in the same two launches, few steps of a
4x2 model. The workers leave out DeepSpeed's shared-memory collective, which its first CPU
start on a machine would compile (~1.5 CPU-minutes; tests/frameworks/deepspeed_cpu.py); the
``deepspeed_ops`` fixture clears a stale build lock should an op be built anyway. The
session's summary prints the cost.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.requires import require

require("deepspeed")

from ckptdash.resume import check_checkpoint
from ckptdash.rundir import manifest
from ckptdash.state.reading import load_state
from tests.frameworks.conftest import DEEPSPEED_COSTS, clear_stale_build_locks
from tests.frameworks.launch import torchrun2
from tests.slurm.harness import read_events
from tests.train.test_distributed import job_env, launch

__all__ = ["launch"]  # the fixture, used here

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("deepspeed_worker.py")
LIGHTNING_LAUNCH_S = 300.0  # Lightning + DeepSpeed start-up on 2 busy cores: up to ~80 s


@pytest.fixture(autouse=True)
def _cpu_accelerator(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, deepspeed_ops: Path
) -> Iterator[None]:
    """DeepSpeed on the CPU accelerator; the test's wall time kept for the summary line."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    began = time.monotonic()
    yield
    DEEPSPEED_COSTS.append((request.node.name, time.monotonic() - began))


def _reports(run: Path) -> list[dict[str, object]]:
    return [json.loads(Path(f"{run}.rank{r}.json").read_text()) for r in (0, 1)]


def _statuses(run: Path) -> dict[str, str]:
    return {Path(p).name: c.status for p, c in load_state(run).checkpoints.items()}


def test_deepspeed_engines_preempted_or_killed_saving_resume_from_the_right_tag(
    tmp_path: Path,
) -> None:
    """Two runs in each of two launches. ZeRO-1: SIGUSR2 to rank 1 alone → both ranks save
    the same tag (a directory with a manifest, the time from the call to durable), `latest`
    names it, one requeue; the next launch loads it into the engine on both ranks and rotates
    beyond keep_last=2, each removal recorded, never the resumed tag. ZeRO-2: the whole job
    SIGKILLed after DeepSpeed wrote its step-5 tag, before it was published → the next launch
    records that save as interrupted, removes the partial temp directory and resumes from the
    step-2 tag."""
    one, two = tmp_path / "zero1", tmp_path / "zero2"
    torchrun2(tmp_path, "first", WORKER, "12", f"{one}:1:signal@4", f"{two}:2:kill@5",
              slurm_restart=0, killed=True)  # fmt: skip
    (sig,) = [c for c in load_state(one).checkpoints.values() if c.trigger == "signal"]
    assert (sig.status, sig.step, Path(sig.path).name) == ("saved", 4, "step4")
    assert manifest.verify(sig.path, expected_digest=sig.checksum) is None
    assert sig.duration_s > 0
    assert (one / "checkpoints" / "latest").read_text() == "step4"
    assert (tmp_path / "scontrol.log").read_text().count("requeue") == 1  # zero2 was killed
    assert [p.name for p in (two / "checkpoints").iterdir() if p.name.startswith(".")]

    torchrun2(tmp_path, "resume", WORKER, "12", f"{one}:1", f"{two}:2", slurm_restart=1)
    step4, step2 = str(one / "checkpoints" / "step4"), str(two / "checkpoints" / "step2")
    assert _reports(one) == [{"start": 5, "loaded": step4, "loaded_ok": True}] * 2
    assert _reports(two) == [{"start": 3, "loaded": step2, "loaded_ok": True}] * 2
    assert load_state(one).attempts[1].resumed_from == step4
    assert load_state(two).attempts[1].resumed_from == step2
    failed = [e for e in read_events(two) if e.KIND == "checkpoint_failed"]
    assert [(e.step, Path(e.path).name) for e in failed] == [(5, "step5")]
    assert failed[0].error.startswith("interrupted: attempt 0 ended during this save")
    # keep_last=2 plus the tag each run resumed from, which rotation never removes.
    assert _statuses(one) == {
        "step2": "removed", "step4": "saved", "step5": "removed", "step8": "saved",
        "step11": "saved",
    }  # fmt: skip
    assert _statuses(two) == {
        "step2": "saved", "step5": "removed", "step8": "saved", "step11": "saved"
    }  # fmt: skip
    for run in (one, two):
        assert (run / "checkpoints" / "latest").read_text() == "step11"
        assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".")]


def test_lightnings_deepspeed_strategy_on_cpu_saves_resumes_and_skips_a_killed_save(
    tmp_path: Path, launch: Any
) -> None:
    """Lightning's DeepSpeedStrategy (a renamed test subclass lifting its CUDA-only check,
    ZeRO-2, 2 gloo ranks): SIGUSR2 to rank 1 → one directory checkpoint at the same step on
    both ranks, valid for resume; the requeued attempt resumes from it in place; that attempt's
    signal save killed (whole job) after DeepSpeed wrote it → the third attempt skips the
    partial directory and resumes from the first save again."""
    run = tmp_path / "run"
    r0, r1 = launch(
        "ds-0", job_env(tmp_path, slurm_restart=0), "lightning", run,
        "--steps=12", "--signal-at=3", "--deepspeed",
    ).wait(LIGHTNING_LAUNCH_S)  # fmt: skip
    (saved,) = r0["saves"]
    assert r1["saves"] == [saved] and saved > 3
    (ckpt,) = load_state(run).checkpoints.values()
    assert (ckpt.trigger, ckpt.step, ckpt.status) == ("signal", saved, "saved")
    assert Path(ckpt.path).is_dir() and (Path(ckpt.path) / "checkpoint").is_dir()
    assert check_checkpoint(ckpt) is None
    assert (tmp_path / "scontrol.log").read_text().count("requeue") == 1

    killed = launch(
        "ds-1", job_env(tmp_path, slurm_restart=1), "lightning", run,
        "--steps=12", f"--signal-at={saved + 2}", "--deepspeed", "--kill-in-save",
    )  # fmt: skip
    assert killed.proc.wait(timeout=LIGHTNING_LAUNCH_S) == -signal.SIGKILL, killed.output()
    assert load_state(run).attempts[1].resumed_from == ckpt.path

    r0, r1 = launch(
        "ds-2", job_env(tmp_path, slurm_restart=2), "lightning", run, "--steps=12", "--deepspeed"
    ).wait(LIGHTNING_LAUNCH_S)  # fmt: skip
    assert r0["first"] == r1["first"] == saved and r0["global_step"] == 12
    state = load_state(run)
    assert state.attempts[2].resumed_from == ckpt.path  # not the partial, later directory
    partial = [c for c in state.checkpoints.values() if c.step > saved]
    assert partial and all(c.status != "saved" for c in partial)
    assert state.attempts[2].outcome == "finished"


def test_a_build_lock_nobody_holds_is_cleared_one_held_open_stays(tmp_path: Path) -> None:
    """torch's build lock left by a killed build (no process has it open) is removed, so the
    next DeepSpeed start does not wait on it forever; a lock a live build holds open stays."""
    stale, live = tmp_path / "py311_cpu" / "a" / "lock", tmp_path / "py311_cpu" / "b" / "lock"
    for lock in (stale, live):
        lock.parent.mkdir(parents=True)
        lock.touch()
    fd = os.open(live, os.O_RDONLY)  # as torch's FileBaton keeps it while building
    try:
        assert clear_stale_build_locks(tmp_path) == [stale]
    finally:
        os.close(fd)
    assert not stale.exists() and live.exists()
