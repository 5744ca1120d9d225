"""What the ``ckptdash`` command prints reaches the terminal as text, never as terminal control.

Event strings (a checkpoint path, an error message, a command's author, a host name) come from
files that code on compute nodes, or other members of a project group, write. An ESC in one of
them would reach the user's terminal raw through ``ckptdash status``: it can recolour or clear
the screen, move the cursor over earlier lines (a forged "resumes from"), set the window title,
or, on some terminals, write to the clipboard. A carriage return or a bidirectional override
can make a line read differently from what it holds.

So the command's output streams pass one filter: every control character except newline and
tab, and the Unicode format characters that reorder or break lines, is written as a visible
``\\uXXXX`` escape. It is the same escape JSON uses, so ``status --json`` stays valid JSON that
means the same.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final, TextIO

_CONTROL: Final = (
    *(c for c in range(0x20) if c not in (0x09, 0x0A)),  # C0 (ESC, CR, BS, BEL, ...)
    0x7F,  # DEL
    *range(0x80, 0xA0),  # C1 (CSI, OSC, ... as single code points)
    0x061C,  # Arabic letter mark
    0x200E,  # left-to-right mark
    0x200F,  # right-to-left mark
    0x2028,  # line separator
    0x2029,  # paragraph separator
    *range(0x202A, 0x202F),  # bidirectional embeddings and overrides
    *range(0x2066, 0x206A),  # bidirectional isolates
)
_ESCAPES: Final = {c: f"\\u{c:04x}" for c in _CONTROL}


def printable(text: str) -> str:
    """``text`` with every character that would control the terminal written as ``\\uXXXX``.

    >>> printable("ok\\x1b[2Jgone")
    'ok\\\\u001b[2Jgone'
    """
    return text.translate(_ESCAPES)


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
