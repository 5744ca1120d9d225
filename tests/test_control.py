"""The control channel: commands issued, claimed once and completed; settings read and written."""

from __future__ import annotations

import fcntl
import getpass
import json
import multiprocessing
import os
import secrets
import socket
import stat
import threading
from collections.abc import Callable
from multiprocessing.context import ForkContext, SpawnContext
from pathlib import Path
from typing import Any

import pytest

from ckptdash import control
from ckptdash.control import (
    UNSET,
    Claimed,
    claim,
    complete,
    issue,
    orphans,
    pending,
    read_settings,
    update_settings,
)
from ckptdash.errors import ControlError, MalformedControlFile, RunDirError
from ckptdash.events import (
    Command,
    SaveNow,
    Settings,
    StopAfterSave,
    encode_command,
    encode_settings,
)
from ckptdash.rundir import TEMP_PREFIX, RunDir, atomic_write

ID = "00000000001000000000-0badc0de"


@pytest.fixture
def run(tmp_path: Path) -> RunDir:
    """A run directory as the training side creates it."""
    rd = RunDir(tmp_path / "run")
    rd.ensure()
    return rd


def _mp() -> ForkContext | SpawnContext:
    # fork is fast and needs no importable test module; spawn where fork does not exist.
    if "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


_DROP = object()  # a _command_json override that removes the field


def _command_json(**overrides: Any) -> dict[str, Any]:
    fields = json.loads(encode_command(SaveNow(id=ID, t=1000.0, author="ada", host="login1")))
    fields.update(overrides)
    return {k: v for k, v in fields.items() if v is not _DROP}


# --- issue -----------------------------------------------------------------------------------


def test_issue_then_claim_round_trip(run: RunDir) -> None:
    """An issued command is one owner-only file in the inbox; claim returns it with every field."""
    cmd = issue(run.root, "save_now", author="ada", host="login1", ttl_s=60.0, now=1000.0)

    assert isinstance(cmd, SaveNow)
    assert (cmd.author, cmd.host, cmd.t, cmd.expires_at) == ("ada", "login1", 1000.0, 1060.0)
    inbox_file = run.inbox / f"{cmd.id}.json"
    assert _mode(inbox_file) == 0o600
    assert pending(run.root) == [cmd.id]

    got = claim(run.root, now=1001.0)

    me = getpass.getuser()
    assert got == [Claimed(cmd.id, run.claimed / f"{cmd.id}.json", cmd, None, False, owner=me)]
    assert got[0].spoofed  # signed "ada" but written by this account: flagged
    assert got[0].command_name == "save_now"
    assert not inbox_file.exists()
    assert pending(run) == []
    assert claim(run.root) == []


def test_issue_defaults_author_host_and_ttl(run: RunDir) -> None:
    """Without arguments the command names the current user and host and expires in 600 s."""
    cmd = issue(run, StopAfterSave)

    assert isinstance(cmd, StopAfterSave)
    assert cmd.author == getpass.getuser()
    assert cmd.host == socket.gethostname()
    assert cmd.expires_at == pytest.approx(cmd.t + 600.0)


def test_issue_without_a_login_name_still_names_an_author(
    run: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When getpass cannot name the user (no passwd entry, no $USER), the uid stands in."""

    def no_user() -> str:
        raise OSError("no login name")

    monkeypatch.setattr(getpass, "getuser", no_user)
    assert issue(run, "save_now").author == f"uid-{os.getuid()}"


def test_issue_without_expiry(run: RunDir) -> None:
    """ttl_s=None gives a command without expires_at; it still expires MAX_TTL_S after it
    was issued (a stale click never fires days later), not before."""
    cmd = issue(run, "save_now", ttl_s=None, now=5.0)
    assert cmd.expires_at is None
    assert control.expired(cmd, 5.0 + control.MAX_TTL_S) is False
    assert claim(run, now=5.0 + control.MAX_TTL_S + 1)[0].expired is True


def test_issue_ids_are_unique_and_sort_by_time(run: RunDir) -> None:
    """Ids sort in the order the commands were issued, so claim() takes the oldest first
    (CLAIM_BATCH per call)."""
    ids = [issue(run, "save_now", now=1000.0 + i * 0.001).id for i in range(50)]
    assert len(set(ids)) == 50
    assert pending(run) == ids
    taken: list[str] = []
    while batch := claim(run):
        assert len(batch) <= control.CLAIM_BATCH
        taken += [c.id for c in batch]
    assert taken == ids


def test_issue_never_replaces_an_existing_file(
    run: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second command that would get the same id fails loudly and leaves the first intact."""
    monkeypatch.setattr(secrets, "token_hex", lambda n: "deadbeef")
    first = issue(run, "save_now", now=1000.0, author="first")
    before = (run.inbox / f"{first.id}.json").read_bytes()

    with pytest.raises(ControlError, match="unused command id"):
        issue(run, "stop_after_save", now=1000.0, author="second")

    assert (run.inbox / f"{first.id}.json").read_bytes() == before
    assert pending(run) == [first.id]


def test_issue_unknown_command_lists_the_valid_ones(run: RunDir) -> None:
    """A misspelt command name is refused with the list of commands that exist."""
    with pytest.raises(ControlError, match=r"'reboot'.*save_now, stop_after_save"):
        issue(run, "reboot")
    with pytest.raises(ControlError, match="not a command class"):
        issue(run, Command)
    assert pending(run) == []


@pytest.mark.parametrize("ttl_s", [0.0, -1.0, float("inf"), float("nan")])
def test_issue_rejects_a_meaningless_ttl(run: RunDir, ttl_s: float) -> None:
    """A ttl that is not a positive finite number is refused (None means no expiry)."""
    with pytest.raises(ControlError, match="ttl_s"):
        issue(run, "save_now", ttl_s=ttl_s)


def test_issue_needs_an_existing_run_and_creates_none(tmp_path: Path) -> None:
    """A missing folder, or one that is not a run, is an error with the fix; nothing is created."""
    missing = tmp_path / "nope"
    with pytest.raises(RunDirError, match=r"no such run directory.*run_dir"):
        issue(missing, "save_now")
    assert not missing.exists()

    not_a_run = tmp_path / "empty"
    not_a_run.mkdir()
    with pytest.raises(RunDirError, match="no events/ folder"):
        issue(not_a_run, "save_now")
    assert list(not_a_run.iterdir()) == []


# --- claim: exactly once ---------------------------------------------------------------------


def test_claim_exactly_once_across_threads(run: RunDir) -> None:
    """Eight threads claiming the same 200 commands at once take each exactly once."""
    issued = {issue(run, "save_now").id for _ in range(200)}
    barrier = threading.Barrier(8)
    results: list[list[Claimed]] = [[] for _ in range(8)]

    def claimer(slot: int) -> None:
        barrier.wait()
        while got := claim(run):
            results[slot].extend(got)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    ids = [c.id for r in results for c in r]
    assert len(ids) == len(set(ids))
    assert set(ids) == issued
    assert all(c.command is not None and c.error is None for r in results for c in r)


def _claim_in_process(root: str, barrier: Any, out: Any) -> None:
    barrier.wait()
    ids: list[str] = []
    while got := claim(root):
        ids.extend(c.id for c in got)
    out.put(ids)


def test_claim_exactly_once_across_processes(run: RunDir) -> None:
    """Four processes claiming the same 200 commands at once take each exactly once."""
    issued = {issue(run, "save_now").id for _ in range(200)}
    ctx = _mp()
    barrier = ctx.Barrier(4)
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_claim_in_process, args=(str(run.root), barrier, out)) for _ in range(4)
    ]
    for p in procs:
        p.start()
    per_process = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0

    ids = [i for got in per_process for i in got]
    assert len(ids) == len(set(ids))
    assert set(ids) == issued


def test_claim_while_commands_are_being_issued(run: RunDir) -> None:
    """Claimers racing with issuers never take a half-written file and miss no command."""
    issued: list[str] = []
    claimed: list[Claimed] = []
    lock = threading.Lock()
    issuers_done = threading.Event()

    def issuer() -> None:
        for _ in range(100):
            cmd_id = issue(run, "save_now").id
            with lock:
                issued.append(cmd_id)

    def claimer() -> None:
        while True:
            finished = issuers_done.is_set()  # read before claiming, so the last pass sees all
            got = claim(run)
            with lock:
                claimed.extend(got)
            if finished and not got:
                return

    issuers = [threading.Thread(target=issuer) for _ in range(2)]
    claimers = [threading.Thread(target=claimer) for _ in range(3)]
    for t in issuers + claimers:
        t.start()
    for t in issuers:
        t.join()
    issuers_done.set()
    for t in claimers:
        t.join()

    ids = [c.id for c in claimed]
    assert len(ids) == len(set(ids)) == 200
    assert set(ids) == set(issued)
    assert [c.error for c in claimed if c.error] == []
    assert sorted(os.listdir(run.inbox)) == []


def test_temp_files_in_the_inbox_are_left_alone(run: RunDir) -> None:
    """Temp files of writes in progress and NFS silly-renamed files are not claimed or pending."""
    temp = run.inbox / f"{TEMP_PREFIX}{ID}.json.123.abcd"
    temp.write_bytes(b"{")
    silly = run.inbox / ".nfs000000000123abcd00000001"
    silly.write_bytes(b"")
    cmd = issue(run, "save_now")

    assert pending(run) == [cmd.id]
    assert [c.id for c in claim(run)] == [cmd.id]
    assert temp.exists()
    assert silly.exists()


def test_a_file_that_cannot_be_moved_stays_pending_with_a_warning(run: RunDir) -> None:
    """A command whose rename fails for another reason than a lost race warns and is not lost."""
    blocked = issue(run, "save_now", now=1.0)
    (run.claimed / f"{blocked.id}.json").mkdir()  # something in the way of the rename
    (run.claimed / f"{blocked.id}.json" / "x").write_bytes(b"")
    good = issue(run, "save_now", now=2.0)

    with pytest.warns(RuntimeWarning, match=f"{blocked.id}.json: cannot claim it"):
        got = claim(run)

    assert [c.command for c in got] == [good]
    assert pending(run) == [blocked.id]


# --- claim: malformed files ------------------------------------------------------------------


def _write(name: str, data: bytes) -> Callable[[Path], str]:
    def make(inbox: Path) -> str:
        (inbox / name).write_bytes(data)
        return name

    return make


def _json(name: str, obj: Any) -> Callable[[Path], str]:
    return _write(name, json.dumps(obj).encode())


def _huge(inbox: Path) -> str:
    # Sparse: 16 GiB on paper, nothing on disk; reading it whole would exhaust the test.
    with open(inbox / f"{ID}.json", "wb") as f:
        f.truncate(16 << 30)
    return f"{ID}.json"


def _directory(inbox: Path) -> str:
    (inbox / f"{ID}.json").mkdir()
    return f"{ID}.json"


def _fifo(inbox: Path) -> str:
    os.mkfifo(inbox / f"{ID}.json")
    return f"{ID}.json"


def _symlink(inbox: Path) -> str:
    target = inbox.parent / "elsewhere.json"
    target.write_bytes(json.dumps(_command_json()).encode())
    (inbox / f"{ID}.json").symlink_to(target)
    return f"{ID}.json"


MALFORMED: dict[str, Callable[[Path], str]] = {
    "garbage_bytes": _write(f"{ID}.json", b"\x00\xff\xfe not json at all"),
    "empty_file": _write(f"{ID}.json", b""),
    "json_not_an_object": _json(f"{ID}.json", [1, 2, 3]),
    "unknown_command": _json(f"{ID}.json", _command_json(command="reboot")),
    "missing_field": _json(f"{ID}.json", _command_json(author=_DROP)),
    "wrong_type": _json(f"{ID}.json", _command_json(t="yesterday")),
    "extra_field": _json(f"{ID}.json", _command_json(sudo=True)),
    "name_differs_from_id": _json("00000000002000000000-0badc0de.json", _command_json()),
    "huge_file": _huge,
}
NOT_COMMANDS: dict[str, Callable[[Path], str]] = {
    "bad_id": _json("not an id!.json", _command_json(id="not an id!")),
    "not_json_suffix": _json(f"{ID}.txt", _command_json()),
    "dot_file": _json(".bashrc", _command_json()),
    "directory": _directory,
    "fifo": _fifo,
    "symlink": _symlink,
}


@pytest.mark.parametrize("make", NOT_COMMANDS.values(), ids=NOT_COMMANDS.keys())
def test_only_regular_files_with_command_names_are_ever_claimed(
    run: RunDir, make: Callable[[Path], str]
) -> None:
    """A folder, a FIFO, a symbolic link, or a file not named ``<id>.json`` (``.bashrc``) is
    never claimed or moved: it stays in the inbox, and the real command next to it is
    claimed; the dashboard's reader shows it as malformed."""
    name = make(run.inbox)
    good = issue(run, "save_now")

    got = claim(run)

    assert [c.path.name for c in got] == [f"{good.id}.json"]
    assert os.path.lexists(run.inbox / name)
    assert not os.path.lexists(run.claimed / name)
    assert orphans(run) == got


@pytest.mark.parametrize("make", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_command_files_come_back_with_an_error(
    run: RunDir, make: Callable[[Path], str]
) -> None:
    """A file that is not a valid command is claimed, not dropped, with an error naming it."""
    name = make(run.inbox)
    good = issue(run, "save_now")

    got = {c.path.name: c for c in claim(run)}

    assert set(got) == {name, f"{good.id}.json"}
    bad = got[name]
    assert bad.command is None
    assert bad.command_name == ""
    assert bad.error is not None
    assert str(run.claimed / name) in bad.error
    assert bad.id
    assert got[f"{good.id}.json"].command == good
    assert os.path.lexists(run.claimed / name)
    assert not os.path.lexists(run.inbox / name)

    complete(run, bad)

    assert os.path.lexists(run.done / name)
    assert orphans(run) == [got[f"{good.id}.json"]]


def test_huge_command_file_error_gives_its_size(run: RunDir) -> None:
    """An oversized command file is rejected by size, with the size and the limit in the message."""
    _huge(run.inbox)
    (bad,) = claim(run)
    assert bad.error is not None
    assert f"{16 << 30} bytes" in bad.error
    assert str(control.MAX_CONTROL_FILE_BYTES) in bad.error


# --- expiry, orphans, completion -------------------------------------------------------------


def test_expired_commands_are_flagged(run: RunDir) -> None:
    """A command claimed after its expires_at comes back with expired=True; a fresh one does not."""
    old = issue(run, "save_now", ttl_s=10.0, now=1000.0)
    fresh = issue(run, "save_now", ttl_s=10.0, now=1005.0)

    got = {c.id: c for c in claim(run, now=1010.5)}

    assert got[old.id].expired is True
    assert got[old.id].command == old
    assert got[fresh.id].expired is False


def _claim_then_die(root: str) -> None:
    claim(root)
    os._exit(3)  # killed between the claim and the outcome event: no cleanup at all


def test_orphans_are_found_after_a_claimer_dies(run: RunDir) -> None:
    """Commands a dead process claimed but never completed are orphans, parsed like claim does."""
    cmd = issue(run, "stop_after_save")
    (run.inbox / "junk.json").write_bytes(b"junk")
    proc = _mp().Process(target=_claim_then_die, args=(str(run.root),))
    proc.start()
    proc.join(timeout=60)
    assert proc.exitcode == 3

    assert claim(run) == []
    found = orphans(run)

    assert [c.id for c in found] == [cmd.id, "junk"]
    assert found[0].command == cmd
    assert found[1].command is None
    assert found[1].error is not None
    assert "junk.json" in found[1].error

    for c in found:
        complete(run, c)
    assert orphans(run) == []
    assert sorted(os.listdir(run.done)) == sorted([f"{cmd.id}.json", "junk.json"])


def test_complete_moves_to_done_and_is_idempotent(run: RunDir) -> None:
    """complete() by id moves claimed/<id>.json to done/; repeating it or an unknown id is fine."""
    cmd = issue(run, "save_now")
    claim(run)

    complete(run, cmd.id)
    complete(run, cmd.id)
    complete(run, "00000000000000000000-00000000")

    assert os.listdir(run.claimed) == []
    assert os.listdir(run.done) == [f"{cmd.id}.json"]
    assert orphans(run) == []


def test_complete_refuses_a_path_for_an_id(run: RunDir) -> None:
    """An id that would escape claimed/ is refused instead of moving some other file."""
    with pytest.raises(ControlError, match="not a command file name"):
        complete(run, "../../events/x")


def test_claim_on_a_run_without_control_folders(tmp_path: Path) -> None:
    """The training side may poll before anyone issued a command: nothing to claim, no error."""
    assert claim(tmp_path) == []
    assert orphans(tmp_path) == []
    assert pending(tmp_path) == []


# --- settings --------------------------------------------------------------------------------


def test_settings_default_when_there_is_no_file(run: RunDir, tmp_path: Path) -> None:
    """Without a settings file (or even a control folder) the defaults apply."""
    assert read_settings(run) == Settings()
    assert read_settings(tmp_path / "nowhere") == Settings()


def test_update_settings_changes_only_what_is_given(run: RunDir) -> None:
    """Each update changes the named settings, keeps the rest, and records who and when."""
    s1 = update_settings(run, requeue_suspended=True, author="ada", now=10.0)
    assert s1 == Settings(requeue_suspended=True, updated_at=10.0, updated_by="ada")
    assert read_settings(run) == s1
    assert _mode(run.settings) == 0o600

    s2 = update_settings(run, resume_pin="checkpoints/step=100.ckpt", author="bob", now=11.0)
    assert (s2.requeue_suspended, s2.resume_pin, s2.updated_by) == (
        True,
        "checkpoints/step=100.ckpt",
        "bob",
    )

    s3 = update_settings(run, requeue_suspended=False, resume_pin=UNSET, now=12.0)
    assert (s3.requeue_suspended, s3.resume_pin) == (False, "checkpoints/step=100.ckpt")
    assert s3.updated_by == f"{getpass.getuser()}@{socket.gethostname()}"

    s4 = update_settings(run, resume_pin=None, now=13.0)
    assert (s4.requeue_suspended, s4.resume_pin) == (False, None)
    assert read_settings(run) == s4


def test_read_settings_reads_fresh_every_time(run: RunDir) -> None:
    """A change written by someone else is seen by the very next read (no cache)."""
    update_settings(run, requeue_suspended=True)
    assert read_settings(run).requeue_suspended is True
    atomic_write(run.settings, encode_settings(Settings(resume_pin="a.ckpt")))
    assert read_settings(run) == Settings(resume_pin="a.ckpt")
    run.settings.unlink()
    assert read_settings(run) == Settings()


@pytest.mark.parametrize(
    "content",
    [b"", b"{not json", b'{"requeue_suspended": "yes"}', b'{"surprise": 1}', b"[]"],
    ids=["empty", "corrupt", "wrong_type", "unknown_field", "not_an_object"],
)
def test_malformed_settings_raise_and_are_not_clobbered(run: RunDir, content: bytes) -> None:
    """A settings file that does not parse is an error naming it, and update leaves it as it is."""
    run.settings.write_bytes(content)

    with pytest.raises(MalformedControlFile, match=r"settings\.json"):
        read_settings(run)
    with pytest.raises(MalformedControlFile, match=r"settings\.json"):
        update_settings(run, requeue_suspended=True)

    assert run.settings.read_bytes() == content


def test_settings_that_are_a_directory_raise(run: RunDir) -> None:
    """A directory where the settings file belongs is reported, not crashed on."""
    run.settings.mkdir()
    with pytest.raises(MalformedControlFile, match="a directory"):
        read_settings(run)


def test_a_pin_and_a_fresh_start_request_replace_each_other(run: RunDir) -> None:
    """A new pin is used once unless sticky; asking for a fresh start drops the pin, and a
    pin set after it drops the request (the latest one wins)."""
    s = update_settings(run, resume_pin="checkpoints/step=5.ckpt")
    assert (s.resume_pin, s.resume_pin_sticky, s.fresh_start) == (
        "checkpoints/step=5.ckpt",
        False,
        False,
    )
    s = update_settings(run, resume_pin="checkpoints/step=5.ckpt", sticky=True)
    assert s.resume_pin_sticky
    s = update_settings(run, fresh_start=True)
    assert (s.resume_pin, s.resume_pin_sticky, s.fresh_start) == (None, False, True)
    s = update_settings(run, resume_pin="checkpoints/step=6.ckpt")
    assert (s.resume_pin, s.fresh_start) == ("checkpoints/step=6.ckpt", False)
    assert read_settings(run) == s


@pytest.mark.parametrize(
    "kwargs",
    [{"requeue_suspended": "yes"}, {"resume_pin": ""}, {"resume_pin": 3}],
    ids=["suspended_not_bool", "empty_pin", "pin_not_str"],
)
def test_update_settings_refuses_values_the_reader_would_reject(
    run: RunDir, kwargs: dict[str, Any]
) -> None:
    """A value that would make settings.json unreadable is refused before anything is written."""
    with pytest.raises(ControlError):
        update_settings(run, **kwargs)
    assert not run.settings.exists()


@pytest.mark.parametrize("now", [-1.0, float("nan")], ids=["negative", "nan"])
def test_update_settings_refuses_a_time_the_reader_would_reject(run: RunDir, now: float) -> None:
    """A bad updated_at is refused and the previous settings stay in place."""
    before = update_settings(run, requeue_suspended=True, now=5.0)
    with pytest.raises(ControlError, match="refusing to write"):
        update_settings(run, requeue_suspended=False, now=now)
    assert read_settings(run) == before


def test_settings_without_group_steering_stay_readable_by_the_previous_release(
    run: RunDir,
) -> None:
    """The previous release's reader forbids unknown fields: a run that never opted in to group
    steering writes a settings file that reader accepts; one that opted in names the field (and
    reads back here)."""
    import msgspec

    previous = msgspec.defstruct(
        "PreviousSettings",
        [
            (f, t, msgspec.field(default=d))
            for f, t, d in [
                ("v", int, 1),
                ("requeue_suspended", bool, False),
                ("resume_pin", "str | None", None),
                ("resume_pin_sticky", bool, False),
                ("fresh_start", bool, False),
                ("health", dict[str, float], {}),
                ("updated_at", float, 0.0),
                ("updated_by", str, ""),
            ]
        ],
        kw_only=True,
        forbid_unknown_fields=True,
    )
    update_settings(run, requeue_suspended=True, resume_pin="checkpoints/a.ckpt")
    old = msgspec.json.decode(run.settings.read_bytes(), type=previous, strict=True)
    assert (old.requeue_suspended, old.resume_pin) == (True, "checkpoints/a.ckpt")
    update_settings(run, group_steering=True)
    assert read_settings(run).group_steering
    assert json.loads(run.settings.read_bytes())["group_steering"] is True


def test_update_settings_needs_an_existing_run(tmp_path: Path) -> None:
    """Settings are not written into a folder that is not a run."""
    with pytest.raises(RunDirError):
        update_settings(tmp_path / "nope", requeue_suspended=True)
    assert not (tmp_path / "nope").exists()


def _read_settings_until(root: str, versions: Any, ready: Any, stop: Any, out: Any) -> None:
    problems: list[str] = []
    reads = 0
    ready.wait()
    while not stop.is_set():
        try:
            s = read_settings(root)
        except Exception as exc:
            problems.append(repr(exc))
            continue
        reads += 1
        if (s.requeue_suspended, s.resume_pin) not in versions:
            problems.append(repr(s))
    out.put((reads, problems))


def test_settings_replaced_atomically_while_being_read(
    run: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Readers racing 2000 rewrites always see one whole written version: never empty or mixed."""
    versions = [(True, "pin-a"), (False, "pin-b")]
    update_settings(run, requeue_suspended=True, resume_pin="pin-a")
    ctx = _mp()
    ready, stop, out = ctx.Barrier(3), ctx.Event(), ctx.Queue()
    readers = [
        ctx.Process(target=_read_settings_until, args=(str(run.root), versions, ready, stop, out))
        for _ in range(2)
    ]
    for p in readers:
        p.start()
    # Atomicity comes from the rename, not from fsync; skipping fsync halves the test's time.
    monkeypatch.setattr(os, "fsync", lambda fd: None)

    def writer() -> None:
        ready.wait()
        try:
            for i in range(2000):
                suspended, pin = versions[i % 2]
                update_settings(run, requeue_suspended=suspended, resume_pin=pin)
        finally:
            stop.set()

    thread = threading.Thread(target=writer)
    thread.start()
    thread.join()
    results = [out.get(timeout=60) for _ in readers]
    for p in readers:
        p.join(timeout=60)
        assert p.exitcode == 0

    assert [problem for _, problems in results for problem in problems] == []
    assert all(reads > 0 for reads, _ in results)


N_UPDATES = 150


def _toggle_suspended(root: str, barrier: Any, out: Any) -> None:
    # Only this process changes requeue_suspended: whatever anyone reads after our
    # update must show our value, or another writer carried a stale one over it.
    problems: list[str] = []
    barrier.wait()
    for i in range(N_UPDATES):
        value = i % 2 == 0
        update_settings(root, requeue_suspended=value)
        seen = read_settings(root).requeue_suspended
        if seen is not value:
            problems.append(f"update {i}: set requeue_suspended={value}, read {seen}")
    out.put(problems)


def _advance_pin(root: str, barrier: Any, out: Any) -> None:
    # Only this process changes resume_pin, always upwards.
    problems: list[str] = []
    barrier.wait()
    for i in range(N_UPDATES):
        pin = f"pin-{i:06d}"
        update_settings(root, resume_pin=pin)
        seen = read_settings(root).resume_pin
        if seen != pin:
            problems.append(f"update {i}: set resume_pin={pin}, read {seen}")
    out.put(problems)


def _watch_pin(root: str, barrier: Any, stop: Any, out: Any) -> None:
    # A lost update shows as the pin going back to an older value.
    problems: list[str] = []
    last = ""
    barrier.wait()
    while not stop.is_set():
        try:
            pin = read_settings(root).resume_pin or ""
        except Exception as exc:
            problems.append(repr(exc))
            continue
        if pin < last:
            problems.append(f"resume_pin went back from {last} to {pin}")
        last = pin
    out.put(problems)


def test_concurrent_updates_from_processes_lose_nothing(run: RunDir) -> None:
    """Processes updating different settings at once never undo each other's change.

    One process only toggles requeue_suspended, one only advances resume_pin;
    a read-modify-write without the lock would carry a stale value of the other
    setting over a fresh one, which the writers (reading back) and the two
    readers (the pin may never go backwards) catch.
    """
    ctx = _mp()
    barrier = ctx.Barrier(4)
    stop = ctx.Event()
    writers_out = ctx.Queue()
    readers_out = ctx.Queue()
    root = str(run.root)
    writers = [
        ctx.Process(target=fn, args=(root, barrier, writers_out))
        for fn in (_toggle_suspended, _advance_pin)
    ]
    readers = [
        ctx.Process(target=_watch_pin, args=(root, barrier, stop, readers_out)) for _ in range(2)
    ]
    for p in writers + readers:
        p.start()
    try:
        problems = [writers_out.get(timeout=120) for _ in writers]
    finally:
        stop.set()
    problems += [readers_out.get(timeout=60) for _ in readers]
    for p in writers + readers:
        p.join(timeout=60)
        assert p.exitcode == 0

    assert [p for ps in problems for p in ps] == []
    final = read_settings(run)
    assert final.requeue_suspended is ((N_UPDATES - 1) % 2 == 0)
    assert final.resume_pin == f"pin-{N_UPDATES - 1:06d}"


def test_settings_lock_survives_a_filesystem_without_locks(
    run: RunDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where flock is refused (Lustre without -o flock) the update still happens, with a warning."""

    def no_locks(fd: int, op: int) -> None:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.warns(RuntimeWarning, match="refuses locks"):
        s = update_settings(run, requeue_suspended=True)
    assert read_settings(run) == s
