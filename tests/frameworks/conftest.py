"""The DeepSpeed tests' shared set-up: the compiled-op cache made safe to reuse, and the tier's
cost printed at the end of the session (the issue asks for it; docs/frameworks.md quotes it)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

DEEPSPEED_COSTS: list[tuple[str, float]] = []
"""(test name, wall seconds) of each DeepSpeed test run in this session."""
_COMPILED: list[str] = []
"""The ops DeepSpeed compiled during this session (none when the cache already held them)."""


def extensions_root() -> Path:
    """Where torch keeps the ops it compiles (``TORCH_EXTENSIONS_DIR``, else
    ``~/.cache/torch_extensions``): DeepSpeed's CPU collective is built there once a machine."""
    from torch.utils.cpp_extension import get_default_build_root

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())


def _held_open(path: Path) -> bool:
    """Whether any process this user can see has ``path`` open (Linux ``/proc/PID/fd``)."""
    target = str(path)
    for fd in Path("/proc").glob("[0-9]*/fd/*"):
        try:
            if os.readlink(fd) == target:
                return True
        except OSError:
            continue  # gone meanwhile, or another user's
    return False


def clear_stale_build_locks(root: Path) -> list[Path]:
    """Remove each build lock under ``root`` that no process holds; returns them.

    torch's builder takes ``BUILD_DIR/lock`` (created exclusively, kept open until the build
    ends) and every other process waits, without a timeout, until the file is gone: one left by a
    build that was killed (a test timing out during the first start) hangs every later DeepSpeed
    start on the machine. A lock some process holds open is a build in progress and stays."""
    stale = [lock for lock in root.glob("*/*/lock") if not _held_open(lock)]
    for lock in stale:
        lock.unlink(missing_ok=True)
    return stale


BUILD_BOUND_S = 540.0
"""A bound on building DeepSpeed's CPU collective before the first test: about 1.5 CPU-minutes,
but over three minutes of wall on two cores shared with the rest of the suite."""

_BUILD_SHM_OP = """
from deepspeed.accelerator import get_accelerator
import deepspeed.ops
builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
    builder.load()
"""
"""What DeepSpeed's comm backend does at its first ``init_distributed`` on the CPU
accelerator (``deepspeed.comm.torch.build_shm_op``), done once, on its own."""


def _build_shm_op(root: Path) -> None:
    """Compile DeepSpeed's shared-memory collective into ``root`` unless it is there already.

    Every DeepSpeed start builds it when the cache lacks it, so on a fresh machine the first
    test's launch would also hold the build; its hang bound is sized for training, not for a
    compiler sharing two cores with the suite (a fresh-clone run's first launch was killed at
    180 s with the build a few seconds from its end)."""
    if any(root.glob("*/deepspeed_shm_comm/*.so")):
        return
    env = {**os.environ, "DS_ACCELERATOR": "cpu"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _BUILD_SHM_OP],
            env=env,
            capture_output=True,
            text=True,
            timeout=BUILD_BOUND_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"building DeepSpeed's CPU collective took over {BUILD_BOUND_S:.0f} s")
    assert done.returncode == 0, f"building DeepSpeed's CPU collective failed:\n{done.stderr}"


@pytest.fixture(scope="session")
def deepspeed_ops() -> Iterator[Path]:
    """The compiled-op cache, its stale build locks cleared (each one a warning) and DeepSpeed's
    CPU collective built in it; at the end of the session, which ops were compiled during it."""
    root = extensions_root()
    for lock in clear_stale_build_locks(root):
        warnings.warn(f"removed a stale torch extension build lock: {lock}", stacklevel=1)
    began = time.time()
    _build_shm_op(root)
    yield root
    _COMPILED.extend(
        str(so.parent.name) for so in root.glob("*/*/*.so") if so.stat().st_mtime >= began
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not DEEPSPEED_COSTS:
        return
    total = sum(s for _, s in DEEPSPEED_COSTS)
    terminalreporter.section("DeepSpeed tier: cost")
    for name, seconds in DEEPSPEED_COSTS:
        terminalreporter.write_line(f"{name}: {seconds:.0f} s")
    built = f"compiled now: {', '.join(_COMPILED)}" if _COMPILED else "ops from the cache"
    terminalreporter.write_line(f"total: {total:.0f} s wall ({built}, in {extensions_root()})")
