"""Finding what a framework plugin really wrote for a path it was handed
(ckptdash.train.checkpoints.written), on real folders: the handed path, one file that
appeared near it, a folder named like it, or nothing that can be told apart."""

from __future__ import annotations

from pathlib import Path

from ckptdash.train.checkpoints import written


def _around(
    folder: Path, given: Path, write: list[Path], *, dirs: list[Path] = ()
) -> written.Located:  # type: ignore[assignment]
    before = written.listing(folder)
    for d in dirs:
        d.mkdir(parents=True)
    for f in write:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"x" * 10)
    return written.locate(str(given), before, written.listing(folder))


def test_the_handed_path_wins_when_something_is_there(tmp_path: Path) -> None:
    """A plugin that wrote where it was told is recorded there, whatever else changed."""
    given = tmp_path / "step=5.ckpt"
    found = _around(tmp_path, given, [given, tmp_path / "sidecar.json"])
    assert found.path == str(given)


def test_one_file_in_a_store_subfolder_is_found(tmp_path: Path) -> None:
    """The file a plugin put in ``store/`` next to the path (the folder itself new) is found;
    on the next save over the same name, the changed file is found again."""
    given = tmp_path / "last.ckpt"
    real = tmp_path / "store" / "last.ckpt"
    assert _around(tmp_path, given, [real]).path == str(real)
    before = written.listing(tmp_path)
    real.write_bytes(b"y" * 99)
    assert written.locate(str(given), before, written.listing(tmp_path)).path == str(real)


def test_a_same_size_rewrite_within_one_clock_tick_is_still_found(tmp_path: Path) -> None:
    """A file rewritten in place at the same size can keep its mtime (coarse filesystem
    clocks): then the one file near the path with the checkpoint's name is taken."""
    given = tmp_path / "last.ckpt"
    real = tmp_path / "store" / "last.ckpt"
    real.parent.mkdir()
    real.write_bytes(b"x" * 10)
    snapshot = written.listing(tmp_path)
    assert written.locate(str(given), snapshot, dict(snapshot)).path == str(real)


def test_a_new_folder_named_like_the_checkpoint_is_the_checkpoint(tmp_path: Path) -> None:
    """A plugin that writes a folder of shards under another root gets the folder, not a shard."""
    given = tmp_path / "step=7.ckpt"
    shards = tmp_path / "mirror" / "step=7.ckpt"
    found = _around(tmp_path, given, [shards / "a.distcp", shards / "b.distcp"])
    assert found.path == str(shards)


def test_a_file_named_after_the_stem_beats_other_changes(tmp_path: Path) -> None:
    """``step=3.pt`` written for ``step=3.ckpt`` beside an index file the plugin also updates."""
    given = tmp_path / "step=3.ckpt"
    real = tmp_path / "blobs" / "step=3.pt"
    found = _around(tmp_path, given, [real, tmp_path / "blobs" / "index.json"])
    assert found.path == str(real)


def test_several_candidates_or_none_leave_it_unvalidated_with_the_reason(tmp_path: Path) -> None:
    """Two equally likely files, or nothing near the path: no guess, a reason that says why."""
    given = tmp_path / "step=1.ckpt"
    two = _around(tmp_path, given, [tmp_path / "a" / "step=1.ckpt", tmp_path / "b" / "step=1.ckpt"])
    assert two.path is None and "several files changed" in two.why_not
    nothing = _around(tmp_path, tmp_path / "step=2.ckpt", [])
    assert nothing.path is None and "ckptdash_written_path" in nothing.why_not


def test_files_deeper_than_two_levels_or_in_skipped_folders_are_not_looked_at(
    tmp_path: Path,
) -> None:
    """The search stays near the handed path, and never counts ckptdash's own event files."""
    given = tmp_path / "step=4.ckpt"
    deep = tmp_path / "a" / "b" / "c" / "step=4.ckpt"
    assert _around(tmp_path, given, [deep]).path is None
    events = tmp_path / "events"
    events.mkdir()
    before = written.listing(tmp_path, skip=[events])
    (events / "A0.jsonl").write_text("{}\n")
    assert written.locate(str(given), before, written.listing(tmp_path, skip=[events])).path is None
