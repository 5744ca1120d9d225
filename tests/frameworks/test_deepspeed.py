# ruff: noqa: E402  (the tier is skipped, or failed in CI, before deepspeed is imported)
"""Plain DeepSpeed engines through ckptdash.deepspeed on 2 gloo ranks (CPU, ZeRO 1 and 2):
a preempted job saves one tag, a killed save is skipped, the resume loads the rule's choice.

Each torchrun launch costs ~15-45 s (DeepSpeed's import and engine set-up on 2 cores). The
first DeepSpeed start on a machine compiles its shared-memory collective (~1.5 CPU-minutes),
kept in ``~/.cache/torch_extensions`` (``TORCH_EXTENSIONS_DIR``) for every later test.
"""

from __future__ import annotations

import json
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
from tests.frameworks.conftest import DEEPSPEED_COSTS
from tests.frameworks.launch import torchrun2
from tests.slurm.harness import read_events
from tests.train.test_distributed import job_env, launch

__all__ = ["launch"]  # the fixture, used here

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("deepspeed_worker.py")
LIGHTNING_LAUNCH_S = 300.0  # Lightning + DeepSpeed start-up on 2 busy cores: up to ~80 s


@pytest.fixture(autouse=True)
def _cpu_accelerator(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Iterator[None]:
    """DeepSpeed on the CPU accelerator; the test's wall time kept for the summary line."""
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    began = time.monotonic()
    yield
    DEEPSPEED_COSTS.append((request.node.name, time.monotonic() - began))


def _reports(run: Path) -> list[dict[str, object]]:
    return [json.loads(Path(f"{run}.rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.parametrize("stage", [1, 2])
def test_a_deepspeed_job_preempted_then_killed_saving_resumes_from_the_right_tag(
    stage: int, tmp_path: Path
) -> None:
    """SIGUSR2 to rank 1 alone: both ranks save the same tag (a directory with a manifest,
    the time from the call to durable), `latest` names it, one requeue. The next launch loads
    it into the engine on both ranks, rotates beyond keep_last=2 (never the resumed tag,
    each removal recorded), and is SIGKILLed, whole job, after DeepSpeed wrote its step-8 tag
    but before it was published: the third launch records that save as interrupted, removes
    the partial temp directory and resumes from the step-5 tag."""
    run, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    torchrun2(tmp_path, "first", WORKER, str(run), str(stage), "12", "--signal-at", "4",
              slurm_restart=0)  # fmt: skip
    (sig,) = [c for c in load_state(run).checkpoints.values() if c.trigger == "signal"]
    assert (sig.status, sig.step, Path(sig.path).name) == ("saved", 4, "step4")
    assert manifest.verify(sig.path, expected_digest=sig.checksum) is None
    assert sig.duration_s > 0
    assert (ckpts / "latest").read_text() == "step4"
    assert "requeue" in (tmp_path / "scontrol.log").read_text()

    torchrun2(tmp_path, "killed", WORKER, str(run), str(stage), "12", "--kill-in-save-at", "8",
              slurm_restart=1, killed=True)  # fmt: skip
    assert load_state(run).attempts[1].resumed_from == sig.path

    torchrun2(tmp_path, "resume", WORKER, str(run), str(stage), "12", slurm_restart=2)
    step5 = str(ckpts / "step5")
    assert _reports(run) == [{"start": 6, "loaded": step5, "loaded_ok": True}] * 2
    state = load_state(run)
    assert state.attempts[2].resumed_from == step5
    failed = [e for e in read_events(run) if e.KIND == "checkpoint_failed"]
    assert [(e.step, Path(e.path).name) for e in failed] == [(8, "step8")]  # interrupted
    status = {Path(p).name: c.status for p, c in state.checkpoints.items()}
    assert status == {
        "step2": "removed", "step4": "removed", "step5": "saved", "step8": "saved",
        "step11": "saved",
    }  # fmt: skip
    assert (ckpts / "latest").read_text() == "step11"
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".")]  # no temp left


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
        "--steps=12", "--signal-at=4", "--deepspeed",
    ).wait(LIGHTNING_LAUNCH_S)  # fmt: skip
    assert r0["saves"] == r1["saves"] == [5]
    (ckpt,) = load_state(run).checkpoints.values()
    assert (ckpt.trigger, ckpt.step, ckpt.status) == ("signal", 5, "saved")
    assert Path(ckpt.path).is_dir() and (Path(ckpt.path) / "checkpoint").is_dir()
    assert check_checkpoint(ckpt) is None

    killed = launch(
        "ds-1", job_env(tmp_path, slurm_restart=1), "lightning", run,
        "--steps=12", "--signal-at=7", "--deepspeed", "--kill-in-save",
    )  # fmt: skip
    assert killed.proc.wait(timeout=LIGHTNING_LAUNCH_S) == -signal.SIGKILL, killed.output()
    state = load_state(run)
    assert state.attempts[1].resumed_from == ckpt.path

    r0, r1 = launch(
        "ds-2", job_env(tmp_path, slurm_restart=2), "lightning", run, "--steps=12", "--deepspeed"
    ).wait(LIGHTNING_LAUNCH_S)  # fmt: skip
    assert r0["first"] == r1["first"] == 5 and r0["global_step"] == 12
    state = load_state(run)
    assert state.attempts[2].resumed_from == ckpt.path  # not the partial step-8 directory
    partial = [c for c in state.checkpoints.values() if c.step == 8]
    assert partial and all(c.status != "saved" for c in partial)
    assert state.attempts[2].outcome == "finished"
