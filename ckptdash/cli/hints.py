"""What ``ckptdash`` says for a mistyped command or another tool's flag, instead of argparse's
list of choices: the command it most likely meant (``ckptdash stauts`` -> ``status``)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


def unknown_command(argv: Sequence[str], commands: Iterable[str]) -> str | None:
    """The one-line error for ``argv`` whose command is not one of ``commands``, or None when
    it is (or there is none: ``--help``, ``--version``)."""
    known = sorted(commands)
    word = next((a for a in argv if not a.startswith("-")), None)
    if word is None or word in known:
        return None
    close = difflib.get_close_matches(word, known, n=1, cutoff=0.6)
    hint = f"did you mean `ckptdash {close[0]}`?" if close else f"the commands: {', '.join(known)}"
    return f"no command {word!r}; {hint} (`ckptdash --help` says what each does)"
