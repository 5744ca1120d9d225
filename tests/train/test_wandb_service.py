"""W&B refuses a resumed run id that a killed attempt left open in a shared W&B service; each
attempt ckptdash names the run for starts its own service instead.

A W&B service (``wandb-core``) keeps a run open until the process that began it calls
``finish``. The service belongs to the process that started it and is inherited through
``WANDB_SERVICE`` by its children: a launcher that called ``wandb.setup()`` and restarts its
workers on the same node shares one service with every attempt. An attempt killed on the way
(SIGKILL, OOM) leaves its run open there for as long as the launcher lives.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.train.test_distributed import job_env
from tests.wandb_launcher import launcher_service

wandb = pytest.importorskip("wandb", reason="install the test extra: make test")

pytestmark = pytest.mark.integration

WORKER = Path(__file__).with_name("wandb_attempt.py")


@pytest.fixture
def launcher(tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment a launcher holding a W&B service gives its attempts."""
    env = dict(job_env(tmp_path), WANDB_MODE="offline", WANDB_SILENT="true")
    env["WANDB_DIR"] = str(tmp_path / "wandb-home")
    env.pop("WANDB_SERVICE", None)
    with launcher_service(env) as token:
        yield dict(env, WANDB_SERVICE=token)


def attempt(
    tmp_path: Path, env: dict[str, str], end: str, *raw: str
) -> subprocess.CompletedProcess[str]:
    """One attempt of the run in ``tmp_path/run``, its W&B files in ``tmp_path/logs``."""
    argv = [sys.executable, str(WORKER), str(tmp_path / "run"), str(tmp_path / "logs"), end, *raw]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def test_w_and_b_refuses_a_run_id_a_killed_attempt_left_open_in_its_service(
    tmp_path: Path, launcher: dict[str, str]
) -> None:
    """W&B's own behaviour, without ckptdash: the next attempt's ``wandb.init`` of the same id
    in the launcher's service fails with ``run ID ckptdash-fixed is in use`` (whenever it
    starts: the service never closes the killed attempt's run)."""
    killed = attempt(tmp_path, launcher, "kill", "--raw")
    assert killed.returncode == -9 and "logged ckptdash-fixed" in killed.stdout, killed.stderr
    refused = attempt(tmp_path, launcher, "finish", "--raw")
    assert refused.returncode == 1, (
        "W&B now resumes an id a killed attempt left open in its service: ckptdash's"
        " own_wandb_service (docs/loggers.md) may no longer be needed"
    )
    assert "run ID ckptdash-fixed is in use" in refused.stderr


def test_each_attempt_after_a_kill_gets_its_own_service_and_resumes_the_id(
    tmp_path: Path, launcher: dict[str, str]
) -> None:
    """With ``monitor.loggers.wandb_init_kwargs()`` the attempt after the killed one leaves the
    launcher's service (one line on stderr says so), starts its own and logs into the same
    run id; the killed attempt's run stays in the launcher's service, unharmed."""
    killed = attempt(tmp_path, launcher, "kill")
    assert killed.returncode == -9, killed.stderr[-3000:]
    (derived,) = [ln.split()[1] for ln in killed.stdout.splitlines() if ln.startswith("logged")]
    assert "its own wandb service" not in killed.stderr  # a first attempt keeps the service
    resumed = attempt(tmp_path, launcher, "finish")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"logged {derived}" in resumed.stdout
    assert "ckptdash: W&B: this attempt starts its own wandb service instead of the one" in (
        resumed.stderr
    )
    folders = sorted((tmp_path / "logs" / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all(p.name.endswith(derived) for p in folders)
    assert launcher["WANDB_SERVICE"] != os.environ.get("WANDB_SERVICE")
