"""How sizes, durations, times and numbers read, on the command line and on the dashboard.

One place, so ``ckptdash status`` and every dashboard view say a value the same way. Plain
Python (no Panel): the CLI imports it without loading the dashboard. ``missing`` is what an
unknown value reads as: the dashboard's ``–`` by default, the CLI's tables pass ``-``.
"""

from __future__ import annotations

import math
import time

DASH = "–"  # shown for a value that is not known (yet)


def size(n: int | None, missing: str = DASH) -> str:
    """``512 B``, ``20.9 KiB``, ``1.2 GiB``, ``3.0 TiB``: binary units, as the dashboard's
    checkpoint table (numbro's ``b`` format) writes them, so the CLI and the page agree."""
    if n is None:
        return missing
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def short_id(command_id: str) -> str:
    """A command id as messages show it: its 8 random hex digits (``3f2a91c0``), which tell
    commands apart; the full id (20 digits of issue time, then those) stays in the files and
    in ``--json``."""
    head, _, tail = command_id.rpartition("-")
    if head and len(tail) == 8 and all(c in "0123456789abcdef" for c in tail):
        return tail
    return command_id[:8]


def steps_done(step: int | None, max_steps: int | None, finished: bool) -> int | None:
    """The step to show beside ``/ max_steps``. A 0-based loop (``for step in range(400)``,
    the plain-PyTorch way) reports its last step as 399: once the attempt has *finished*, that
    is all 400 steps done, and reads ``400 / 400``, as Lightning's 1-based count does."""
    if finished and step is not None and max_steps and step == max_steps - 1:
        return max_steps
    return step


def clock(t: float | None, missing: str = DASH) -> str:
    """Local wall time ``2026-11-29 16:57:23``."""
    if t is None:
        return missing
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def duration(seconds: float | None) -> str:
    """``850 ms``, ``12.3 s``, ``4 min 05 s``, ``2 h 13 min``, ``3 d 4 h``."""
    if seconds is None or not math.isfinite(seconds):
        return DASH
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 1:
        return f"{sign}{s * 1000:.0f} ms"
    if s < 60:
        return f"{sign}{s:.1f} s"
    if s < 3600:
        m, sec = divmod(int(s), 60)
        return f"{sign}{m} min {sec:02d} s"
    if s < 86400:
        h, rest = divmod(int(s), 3600)
        return f"{sign}{h} h {rest // 60:02d} min"
    d, rest = divmod(int(s), 86400)
    return f"{sign}{d} d {rest // 3600} h"


def age(then: float | None, now: float) -> str:
    """How long ago ``then`` was, coarse enough not to change on every refresh."""
    if then is None:
        return DASH
    s = max(0.0, now - then)
    if s < 60:
        return f"{s:.0f} s ago"
    return f"{duration(s)} ago"


def rough_age(then: float | None, now: float, missing: str = "-") -> str:
    """How long ago ``then`` was in one unit (``42 s ago``, ``7 min ago``, ``3 h ago``,
    ``2 d ago``): the column of ``ckptdash status FOLDER``, one line per run."""
    if then is None:
        return missing
    s = max(0.0, now - then)
    if s < 120:
        return f"{s:.0f} s ago"
    if s < 7200:
        return f"{s / 60:.0f} min ago"
    if s < 172800:
        return f"{s / 3600:.0f} h ago"
    return f"{s / 86400:.0f} d ago"


def number(value: float | int | None, digits: int = 2) -> str:
    """A number with thousands separators; ``–`` when unknown."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return DASH
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def percent(share: float | None, digits: int = 1) -> str:
    """``12.5 %`` for 0.125."""
    if share is None or not math.isfinite(share):
        return DASH
    return f"{share * 100:.{digits}f} %"
