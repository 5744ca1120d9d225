"""What the ``ckptdash`` command prints reaches the terminal as text, never as terminal control.

Event strings (a checkpoint path, an error message, a command's author, a host name) come from
files that code on compute nodes, or other members of a project group, write. An ESC in one of
them would reach the user's terminal raw through ``ckptdash status``: it can recolour or clear
the screen, move the cursor over earlier lines (a forged "resumes from"), set the window title,
or, on some terminals, write to the clipboard. A carriage return or a bidirectional override
can make a line read differently from what it holds.

So the command's output streams pass one filter: every character Python's
``str.isprintable()`` rejects except newline and tab -- control characters, the Unicode format
characters that reorder or break lines, and the invisible ones (zero-width spaces and joiners,
soft hyphens, tag characters) that would make several run names all read ``exp1`` -- is
written as a visible ``\\uXXXX`` escape (a surrogate pair beyond U+FFFF). It is the same escape
JSON uses, so ``status --json`` stays valid JSON that means the same.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final, TextIO

_KEPT: Final = "\n\t"  # the two non-printable characters a terminal line may hold


def _escape(c: str) -> str:
    if c.isprintable() or c in _KEPT:
        return c
    code = ord(c)
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # JSON's form of an astral character: a UTF-16 surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def printable(text: str) -> str:
    """``text`` with every character ``str.isprintable()`` rejects, except newline and tab,
    written as ``\\uXXXX``.

    >>> printable("ok\\x1b[2Jgone")
    'ok\\\\u001b[2Jgone'
    >>> printable("exp\\u200b1")
    'exp\\\\u200b1'
    """
    # The fast path: most output is plain text with newlines, checked in C.
    if text.replace("\n", "").replace("\t", "").isprintable():
        return text
    return "".join(map(_escape, text))


def one_line(text: str) -> str:
    """``text`` as one line: :func:`printable`, and newlines written as ``\\u000a`` too.

    For a line ckptdash builds around values from a run directory (a path, an error, a
    reason): a newline in a value would otherwise start a line of the value's choosing
    (a forged ``next resume: ...``) that the stream filter lets through.

    >>> one_line("c.ckpt\\nnext resume: evil")
    'c.ckpt\\\\u000anext resume: evil'
    """
    return printable(text).replace("\n", "\\u000a")


class PrintableStream:
    """A text stream that writes everything through :func:`printable` to ``inner``."""

    def __init__(self, inner: TextIO) -> None:
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(printable(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding, ...
        return getattr(self.inner, name)


def unfiltered(stream: TextIO) -> TextIO:
    """The stream under the filter, for ckptdash's own cursor control only: the demo's
    progress line redraws itself with a carriage return and holds nothing but numbers
    ckptdash formats, never event text."""
    return stream.inner if isinstance(stream, PrintableStream) else stream


@contextmanager
def printable_output() -> Iterator[None]:
    """Within the block, ``sys.stdout`` and ``sys.stderr`` write only printable text."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PrintableStream(out), PrintableStream(err)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = out, err
