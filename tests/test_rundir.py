"""Run-directory layout and the atomic-write helper."""

from __future__ import annotations

import array
import os
import stat
import threading
from pathlib import Path

import pytest

from ckptdash.errors import AtomicWriteError, RunDirError
from ckptdash.rundir import RunDir, atomic_write, create_exclusive, find_runs
from ckptdash.rundir.hashing import checksum_file


def test_atomic_write_reports_size_and_checksum_of_what_is_on_disk(tmp_path: Path) -> None:
    """The checksum computed while writing equals a checksum of the file read back."""
    target = tmp_path / "a.bin"
    result = atomic_write(target, lambda f: [f.write(bytes([i]) * 1000) for i in range(50)])
    assert result.size_bytes == 50_000
    assert checksum_file(target) == (result.size_bytes, result.checksum)


def test_big_chunks_hashed_beside_the_write_give_the_same_checksum(tmp_path: Path) -> None:
    """Chunks of several MiB (a tensor's storage) are hashed on a helper thread while they
    are written; mixed with small ones, in any format, the checksum is still that of the
    bytes on disk, and no helper thread outlives the write."""
    big = array.array("d", range(1 << 20))  # 8 MiB of 8-byte items: len() is not the size
    target = tmp_path / "mixed.bin"
    result = atomic_write(
        target, lambda f: [f.write(b"head"), f.write(memoryview(big)), f.write(b"tail")]
    )
    assert result.size_bytes == 8 + 8 * (1 << 20)
    assert checksum_file(target) == (result.size_bytes, result.checksum)
    assert not [t for t in threading.enumerate() if t.name == "ckptdash-hash"]


def test_atomic_write_temp_file_lives_next_to_target(tmp_path: Path) -> None:
    """The temp file is created in the target's directory (never $TMPDIR), then renamed away."""
    seen: list[Path] = []

    def spy(f: object) -> None:
        seen.extend(p for p in tmp_path.iterdir() if p.name != "t.bin")

    atomic_write(tmp_path / "t.bin", spy)
    assert len(seen) == 1 and seen[0].parent == tmp_path
    assert [p.name for p in tmp_path.iterdir()] == ["t.bin"]


def test_failed_write_keeps_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    """An error halfway through leaves the previous file intact and removes the temp file."""
    target = tmp_path / "last.ckpt"
    atomic_write(target, b"old-good")

    def explode(f: object) -> None:
        f.write(b"half")  # type: ignore[attr-defined]
        f.write(bytes(5 << 20))  # type: ignore[attr-defined]  # hashed on the helper thread
        raise RuntimeError("killed mid-save")

    with pytest.raises(RuntimeError):
        atomic_write(target, explode)
    assert target.read_bytes() == b"old-good"
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert not [t for t in threading.enumerate() if t.name == "ckptdash-hash"]


def test_write_into_missing_directory_names_the_path(tmp_path: Path) -> None:
    """A write into a directory that does not exist says which path and what to check."""
    with pytest.raises(AtomicWriteError, match=r"nope/x.*exists and is writable"):
        atomic_write(tmp_path / "nope" / "x", b"1")


def test_atomic_write_applies_mode(tmp_path: Path) -> None:
    """Files can be created owner-only (commands and settings are)."""
    atomic_write(tmp_path / "s.json", b"{}", mode=0o600)
    assert stat.S_IMODE(os.stat(tmp_path / "s.json").st_mode) == 0o600


def test_create_exclusive_only_first_wins(tmp_path: Path) -> None:
    """Exclusive creation never overwrites: the second creator is told it lost."""
    assert create_exclusive(tmp_path / "run.json", b"first")
    assert not create_exclusive(tmp_path / "run.json", b"second")
    assert (tmp_path / "run.json").read_bytes() == b"first"


def test_run_identity_is_stable_across_attempts(tmp_path: Path) -> None:
    """ensure() creates the layout once; a later attempt sees the same run id."""
    first = RunDir(tmp_path / "run").ensure()
    again = RunDir(tmp_path / "run").ensure()
    assert first == again
    assert RunDir(tmp_path / "run").is_run()


def test_find_runs_single_and_parent(tmp_path: Path) -> None:
    """A run directory is found as itself; a parent folder yields each run below it."""
    RunDir(tmp_path / "a").ensure()
    RunDir(tmp_path / "b").ensure()
    (tmp_path / "not-a-run").mkdir()
    assert [r.root.name for r in find_runs(tmp_path)] == ["a", "b"]
    assert [r.root for r in find_runs(tmp_path / "a")] == [tmp_path / "a"]


@pytest.mark.parametrize(
    ("make_path", "message"),
    [
        (lambda p: p / "missing", "no such directory"),
        (lambda p: p, "holds no ckptdash run"),
    ],
)
def test_find_runs_errors_say_what_to_do(tmp_path: Path, make_path: object, message: str) -> None:
    """A missing or empty folder is a RunDirError with the reason and the fix."""
    with pytest.raises(RunDirError, match=message):
        find_runs(make_path(tmp_path))  # type: ignore[operator]


def test_event_file_names_are_unique_per_process(tmp_path: Path) -> None:
    """Event file names carry attempt, rank, host and pid so no file has two writers."""
    name = RunDir(tmp_path).event_file_name(3, 1, host="node 7/x")
    assert name == f"A0003.R0001.node-7-x.{os.getpid()}.jsonl"
