"""Fixtures of the reliability tests: the figures they report, and filesystems that fail.

Every test that injects faults or fuzzes records what it did with ``figures``;
``pytest tests/reliability`` prints them at the end (the numbers quoted in the
docs/reliability.md). ``CKPTDASH_LONG=1`` runs the long variants (see ``benchmarks/faults.py``
for the kill loops on their own).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

FIGURES: dict[str, str] = {}
FUZZED: Counter[str] = Counter()
"""Inputs generated per fuzz target in this run (tests add to it)."""
LONG = os.environ.get("CKPTDASH_LONG", "") not in ("", "0")


def scale(ci: int, long: int) -> int:
    """``ci`` in the CI sample, ``long`` with ``CKPTDASH_LONG=1``."""
    return long if LONG else ci


@pytest.fixture
def figures() -> Callable[[str, str], None]:
    """``figures(name, text)``: report a measured figure in the run's summary."""

    def record(name: str, text: str) -> None:
        FIGURES[name] = text
        print(f"{name}: {text}")

    return record


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FUZZED:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(FUZZED.items()))
        FIGURES["fuzz"] = f"{sum(FUZZED.values())} generated inputs, 0 crashes ({parts})"
    if FIGURES:
        terminalreporter.section("ckptdash reliability figures")
        for name in sorted(FIGURES):
            terminalreporter.write_line(f"{name}: {FIGURES[name]}")


def _run(*cmd: str) -> bool:
    return subprocess.run(cmd, capture_output=True, check=False).returncode == 0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """``small_disk(kib)``: a fresh tmpfs of that size (a disk that fills up). Needs root."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    mounts: list[Path] = []

    def make(kib: int) -> Path:
        path = tmp_path / f"disk{len(mounts)}"
        path.mkdir()
        if not _run("mount", "-t", "tmpfs", "-o", f"size={kib}k,mode=0755", "tmpfs", str(path)):
            pytest.skip("this machine does not allow mounting a tmpfs")
        mounts.append(path)
        return path

    yield make
    for path in reversed(mounts):
        _run("umount", "-l", str(path))


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A folder on a tmpfs where possible (fsync costs nothing there), else ``tmp_path``.

    For tests of parsing and bookkeeping that write thousands of fsync'ed events: on a
    shared CI disk the fsyncs, not ckptdash, would set their run time.
    """
    path = tmp_path / "fast"
    path.mkdir()
    mounted = os.geteuid() == 0 and _run(
        "mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(path)
    )
    try:
        yield path
    finally:
        if mounted:
            _run("umount", "-l", str(path))


@pytest.fixture
def read_only() -> Iterator[Callable[[Path], None]]:
    """``read_only(path)``: bind-mount ``path`` read-only over itself (EROFS even for root)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root (CI runs as root)")
    mounts: list[Path] = []

    def make(path: Path) -> None:
        if not _run("mount", "--bind", str(path), str(path)):
            pytest.skip("this machine does not allow bind mounts")
        mounts.append(path)
        if not _run("mount", "-o", "remount,bind,ro", str(path)):
            pytest.skip("this machine does not allow read-only remounts")

    yield make
    for path in reversed(mounts):
        _run("umount", "-l", str(path))


@pytest.fixture
def nobody_dir() -> Iterator[Path]:
    """A folder owned by ``nobody`` outside pytest's root-only tmp dir (for permission tests)."""
    if os.geteuid() != 0:
        pytest.skip("dropping privileges needs root (CI runs as root)")
    path = Path(tempfile.mkdtemp(prefix="ckptdash-perm-"))
    os.chmod(path, 0o755)
    os.chown(path, 65534, 65534)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
