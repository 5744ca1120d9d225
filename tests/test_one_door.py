"""One door for every file a run holds (issue 35): a walk over the package's syntax tree finds
every ``open``, ``os.open``, ``os.scandir``, ``os.listdir`` and ``Path.read_*`` / ``write_*`` /
``open`` / ``iterdir`` outside the door (:mod:`ckptdash.rundir.door` and the two primitives it
is built on), and fails on any that is not on the allow-list below with its reason.

A new open of a run path goes through :mod:`ckptdash.rundir.door` (non-blocking, no link
followed, ``fstat``-checked: a regular file, the owner's, one link, a size cap); an entry
here says why a call is not such an open, or why what it opens cannot be planted by another
account. Costs about a second (parsing the package once).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Final

PACKAGE: Final = Path(__file__).resolve().parents[1] / "ckptdash"
DOOR: Final = {"rundir/door.py", "rundir/safe_read.py", "control/dirs.py"}
_OS_CALLS: Final = {"open", "scandir", "listdir"}
_PATH_CALLS: Final = {"read_text", "read_bytes", "write_text", "write_bytes", "iterdir", "open"}

_NEW_FILE = "creates a new file with O_CREAT | O_EXCL (a FIFO or link in its place fails)"
_NOT_A_RUN = "not a run path"
_LISTING = "lists names only; every file found is opened through the door"
_DEV = "developer tooling (sample and scale runs, test servers), never a user's run"

ALLOWED: Final[dict[tuple[str, str, str], str]] = {
    ("_dev/sample.py", "write_sample_run", ".write_bytes"): _DEV,
    ("_dev/sample.py", "write_sample_run.ckpt", "open"): _DEV,
    ("_dev/scale_runs.py", "write_run", ".write_bytes"): _DEV,
    ("_dev/scale_runs.py", "write_run", ".write_text"): _DEV,
    ("_dev/scale_runs.py", "write_run", "open"): _DEV,
    ("_dev/testing.py", "ServeProcess.log", "open"): _DEV,
    ("_dev/testing.py", "ServeProcess.rss_bytes", "open"): _DEV,
    ("_dev/testing.py", "offline_jupyter_home", ".write_text"): _DEV,
    ("accelerate.py", "_numbered", ".iterdir"): "Accelerate's own checkpoint folder: names only",
    ("cli/__init__.py", "_main", "os.open"): f"{_NOT_A_RUN}: /dev/null for a closed stdout",
    ("cli/demo.py", "_holds_a_run", ".iterdir"): "the demo's own folder: is anything there",
    ("cli/demo.py", "_train", "open"): "the demo's own log file, in a folder the demo made",
    ("control/command_file.py", "_listing", "os.listdir"): _LISTING,
    ("deepspeed.py", "_rotate", ".iterdir"): "DeepSpeed's own save folder: names only",
    ("dash/access.py", "read_secret_file", "os.open"): (
        f"{_NOT_A_RUN}: the server's token/password file (O_NOFOLLOW, mode checked)"
    ),
    ("dash/feed/mounts.py", "filesystem_type", "open"): f"{_NOT_A_RUN}: /proc/self/mountinfo",
    ("state/runset.py", "fingerprint", "os.scandir"): "stat of names only, nothing opened",
    ("lightning/links.py", "_make_last", "open"): (
        "reads a checkpoint the session just saved and recorded, to copy it as last.ckpt"
    ),
    ("hf.py", "_checkpoints_in", ".iterdir"): "HF's own output folder: names only",
    ("schedulers/evidence.py", "_listing", "os.scandir"): _LISTING,
    ("rundir/__init__.py", "RunDir._ensure_control", "os.open"): (
        "the run folder itself, O_DIRECTORY: the folders in it are opened through open_dir"
    ),
    ("rundir/__init__.py", "RunDir.event_files", ".iterdir"): _LISTING,
    ("rundir/__init__.py", "atomic_write", "os.open"): _NEW_FILE,
    ("rundir/__init__.py", "create_exclusive", "os.open"): _NEW_FILE,
    ("rundir/__init__.py", "find_runs", ".iterdir"): "a folder of runs: names of folders only",
    ("rundir/__init__.py", "fsync_dir", "os.open"): "a folder, O_DIRECTORY, only fsync'ed",
    ("rundir/load_safety.py", "_read_regular", "os.open"): (
        "O_NOFOLLOW | O_NONBLOCK, fstat: a regular file the job's user owns (the DCP check)"
    ),
    ("rundir/load_safety.py", "only_dcp_files", "os.scandir"): _LISTING,
    ("rundir/manifest.py", "hash_file", "open"): "wraps a descriptor open_regular checked",
    ("rundir/process.py", "_proc_stat", ".read_text"): f"{_NOT_A_RUN}: /proc",
    ("rundir/writer.py", "EventWriter._create", "os.open"): _NEW_FILE,
    ("state/snapshot.py", "_read", "os.open"): "the run folder, O_DIRECTORY; then open_dir",
    ("state/snapshot.py", "_write_at", "os.open"): "the run folder, O_DIRECTORY; then open_dir",
    ("state/state_codec.py", "fingerprint", ".read_bytes"): f"{_NOT_A_RUN}: ckptdash's source",
    ("tail/__init__.py", "RunTailer._event_file_names", "os.listdir"): _LISTING,
    ("tail/commands.py", "_listing", "os.listdir"): _LISTING,
    ("tail/pulses.py", "PulseRecords.poll", "os.scandir"): _LISTING,
    ("train/ending/agent.py", "_cmdline", ".read_bytes"): f"{_NOT_A_RUN}: /proc",
    ("train/ending/agent.py", "caught_signals", ".read_text"): f"{_NOT_A_RUN}: /proc",
    (
        "train/tracking/hf_loggers.py",
        "purge_tensorboard",
        ".iterdir",
    ): "TensorBoard's folder: names only",
    ("train/health/node_pulses.py", "NodePulses._members", "os.scandir"): (
        f"{_NOT_A_RUN}: the node folder in /dev/shm, the job user's (0700, checked)"
    ),
    ("train/health/node_pulses.py", "_read_slot", "os.open"): (
        f"{_NOT_A_RUN}: a slot in the job user's 0700 node folder in /dev/shm"
    ),
    (
        "train/starting/recovery.py",
        "remove_temp_files",
        "os.scandir",
    ): "names only, to unlink temp files",
    ("train/checkpoints/written.py", "listing", "os.scandir"): "stat of names only, nothing opened",
}


def _calls() -> Iterator[tuple[str, str, str, int]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel in DOOR:
            continue
        yield from _visit(ast.parse(path.read_text(), str(path)), rel, "")


def _visit(node: ast.AST, rel: str, where: str) -> Iterator[tuple[str, str, str, int]]:
    for child in ast.iter_child_nodes(node):
        here = where
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            here = f"{where}.{child.name}" if where else child.name
        if isinstance(child, ast.Call):
            name = _name(child.func)
            if name:
                yield rel, here or "<module>", name, child.lineno
        yield from _visit(child, rel, here)


def _name(func: ast.expr) -> str:
    if isinstance(func, ast.Name) and func.id == "open":
        return "open"
    if not isinstance(func, ast.Attribute):
        return ""
    module = func.value.id if isinstance(func.value, ast.Name) else ""
    if module == "os":
        return f"os.{func.attr}" if func.attr in _OS_CALLS else ""
    if func.attr in _PATH_CALLS and module not in ("webbrowser", "tarfile", "gzip", "io"):
        return f".{func.attr}"
    return ""


def test_every_open_of_a_run_path_goes_through_the_door() -> None:
    """No open, os.open, scandir, listdir or Path read/write/open/iterdir outside the door
    that the allow-list does not name with its reason."""
    found = list(_calls())
    unexplained = [
        f"ckptdash/{rel}:{line} {where}: {name}"
        for rel, where, name, line in found
        if (rel, where, name) not in ALLOWED
    ]
    assert not unexplained, (
        "open run files through ckptdash.rundir.door (or add the call to ALLOWED with the"
        " reason it is safe):\n" + "\n".join(unexplained)
    )


def test_the_allow_list_names_only_calls_that_exist() -> None:
    """Every allow-list entry is still a call in the package (a stale entry is removed)."""
    seen = {(rel, where, name) for rel, where, name, _ in _calls()}
    assert not sorted(set(ALLOWED) - seen)
    assert all(reason for reason in ALLOWED.values())
