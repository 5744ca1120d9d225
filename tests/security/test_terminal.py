"""`ckptdash status` (a real process, its real stdout and stderr bytes) prints the control
characters of event strings as visible escapes: nothing an event wrote can clear the screen,
move the cursor, set the title or reorder a line of the user's terminal."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ckptdash import events as ev
from ckptdash.rundir.writer import EventWriter
from ckptdash.terminal import printable

CONTROL = (
    "\x1b[2J\x1b[H",  # clear the screen, cursor home
    "\x1b]0;owned\x07",  # set the window title (OSC)
    "\x1b]52;c;aGVsbG8=\x07",  # write the clipboard (OSC 52)
    "\r\x08",  # back over what was printed
    "\x9b31m",  # CSI as one C1 code point
    "\u202egpj.exe",  # right-to-left override
)
RAW = ("\x1b", "\x07", "\r", "\x08", "\x9b", "\u202e")


def _hostile(root: Path) -> Path:
    with EventWriter(root, attempt=0, host="n0" + CONTROL[0]) as w:
        w.emit(ev.RunStarted, step=0, scheduler="slurm", job_id="7" + CONTROL[1])
        w.emit(
            ev.CheckpointSaved,
            step=1,
            path=str(root / ("c.ckpt" + CONTROL[2])),
            trigger="periodic",
            size_bytes=1,
            duration_s=0.1,
        )
        w.emit(ev.SignalReceived, step=1, signal="SIGUSR2", action=CONTROL[3])
        w.emit(ev.RequeueSkipped, step=1, reason=CONTROL[4])
        w.emit(ev.RunFailed, step=1, error=CONTROL[5])
    return root


def _ckptdash(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "ckptdash", *args], capture_output=True, timeout=120
    )


def test_status_prints_event_control_characters_as_escapes(tmp_path: Path) -> None:
    """No raw control character of the events reaches stdout; each shows as \\uXXXX."""
    out = _ckptdash("status", str(_hostile(tmp_path / "run"))).stdout.decode()
    for raw in RAW:
        assert raw not in out, repr(raw)
    assert "\\u001b[2J\\u001b[H" in out
    assert "\\u202egpj.exe" in out
    assert out.count("\n") == len(out.splitlines())  # no \r splitting a line unseen


def test_status_json_stays_the_same_json(tmp_path: Path) -> None:
    """`status --json` keeps every string exactly (the escapes are JSON's own) and raw."""
    done = _ckptdash("status", str(_hostile(tmp_path / "run")), "--json")
    for raw in RAW:
        assert raw.encode() not in done.stdout, repr(raw)
    doc = json.loads(done.stdout)
    assert CONTROL[5] in json.dumps(doc, ensure_ascii=False)


def test_error_messages_are_filtered_too(tmp_path: Path) -> None:
    """An error naming hostile text (here a pin that is no recorded checkpoint) reaches the
    terminal's stderr as escapes as well."""
    run = _hostile(tmp_path / "run")
    done = _ckptdash("resume", str(run), "--pin", "x" + CONTROL[0])
    assert done.returncode == 2
    assert b"\x1b" not in done.stderr
    assert "\\u001b[2J" in done.stderr.decode()


def test_printable_keeps_ordinary_text() -> None:
    """Newlines, tabs and every printable character (any script) pass unchanged."""
    text = "step 12\tsaved /ck/Ünïcødé-检查点.ckpt\n"
    assert printable(text) == text


FORGED = "\nnext resume: /evil.ckpt  (forged)\nALERT none"


def test_newlines_in_event_strings_cannot_forge_status_lines(tmp_path: Path) -> None:
    """A newline inside a recorded value (a path, a host, a reason, an error) is printed as
    ``\\u000a``: `status` and `resume` show exactly one `next resume:` line, ckptdash's own,
    and every line the value tried to start stays inside the line that holds it."""
    root = tmp_path / "run"
    with EventWriter(root, attempt=0, host="n0" + FORGED) as w:
        w.emit(ev.RunStarted, step=0, scheduler="slurm", job_id="7")
        w.emit(
            ev.CheckpointSaved,
            step=1,
            path=str(root / ("c.ckpt" + FORGED)),
            trigger="periodic",
            size_bytes=1,
            duration_s=0.1,
        )
        w.emit(ev.SignalReceived, step=1, signal="SIGUSR2", action="requeue" + FORGED)
        w.emit(ev.RequeueSkipped, step=1, reason="budget" + FORGED)
        w.emit(ev.RunFailed, step=1, error="boom" + FORGED)
    out = _ckptdash("status", str(root), "--no-scheduler").stdout.decode()
    lines = out.splitlines()
    assert [ln for ln in lines if ln.startswith("next resume:")] == [
        next(ln for ln in lines if ln.startswith("next resume:") and "evil" not in ln)
    ]
    assert not [ln for ln in lines if ln.startswith(("ALERT none", "next resume: /evil"))]
    assert out.count("\\u000anext resume: /evil.ckpt") >= 4  # path, host, action, reason
    resume = _ckptdash("resume", str(root)).stdout.decode().splitlines()
    assert [ln.split(":")[0] for ln in resume if not ln.startswith("skipped")] == [
        "next attempt resumes from",
        "because",
    ]


INVISIBLE = ("\u200b", "\u200d", "\u2060", "\ufeff", "\u00ad", "\U000e0041")  # ZWSP ... tag A


def test_invisible_characters_in_run_names_are_escaped(tmp_path: Path) -> None:
    """Run folders named ``exp1`` with a zero-width space, a zero-width joiner, a word joiner,
    a BOM, a soft hyphen or a tag character inside: ``ckptdash status RUNS/`` prints each name
    with a visible escape (no two rows read ``exp1``), since everything ``str.isprintable()``
    rejects except newline and tab is escaped."""
    runs = tmp_path / "RUNS"
    for mark in ("", *INVISIBLE):
        with EventWriter(runs / f"exp{mark}1", attempt=0) as w:
            w.emit(ev.RunStarted, step=0)
    out = _ckptdash("status", str(runs), "--no-scheduler").stdout.decode()
    names = [line.split()[0] for line in out.splitlines()[1:] if line.startswith("exp")]
    assert len(names) == len(set(names)) == 1 + len(INVISIBLE)
    assert all(c.isprintable() for name in names for c in name)
    assert "exp\\u200b1" in names and "exp\\udb40\\udc411" in names
    assert printable("tab\tand newline\n") == "tab\tand newline\n"
