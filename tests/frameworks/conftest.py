"""The DeepSpeed tests' shared set-up: the compiled-op cache made safe to reuse, and the tier's
cost printed at the end of the session (the issue asks for it; docs/frameworks.md quotes it)."""

from __future__ import annotations

import os
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


@pytest.fixture(scope="session")
def deepspeed_ops() -> Iterator[Path]:
    """The compiled-op cache, its stale build locks cleared (each one a warning); at the end of
    the session, which ops were compiled during it (none: the workers leave DeepSpeed's CPU
    collective out, tests/frameworks/deepspeed_cpu.py)."""
    root = extensions_root()
    for lock in clear_stale_build_locks(root):
        warnings.warn(f"removed a stale torch extension build lock: {lock}", stacklevel=1)
    began = time.time()
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
