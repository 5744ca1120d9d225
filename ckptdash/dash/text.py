"""How numbers and times read on the dashboard: one place, so every view says it the same way."""

from __future__ import annotations

import html
import math
import os
import time

DASH = "–"  # shown for a value that is not known (yet)


def esc(value: object) -> str:
    """``value`` as text that is safe inside HTML (paths and reasons come from files)."""
    return html.escape(str(value), quote=True)


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


def size(n: int | None) -> str:
    """``512 B``, ``20.9 KB``, ``1.2 GB`` (powers of 1024, as ``ckptdash status`` prints)."""
    if n is None:
        return DASH
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1024 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def clock(t: float | None) -> str:
    """Local wall time ``2026-11-29 16:57:23`` (as ``ckptdash status`` prints it)."""
    if t is None:
        return DASH
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


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


def relative(path: str, root: str) -> str:
    """``path`` relative to the run directory ``root`` when it lies inside it, else as given.

    Checkpoint paths are recorded absolute and are long; inside one run's view the run
    directory is known, so ``checkpoints/step=37-signal.ckpt`` says it all.
    """
    if not path or not root:
        return path
    if os.path.isabs(path) != os.path.isabs(root):  # runs/x given, /home/…/runs/x recorded
        path, root = os.path.abspath(path), os.path.abspath(root)
    rel = os.path.relpath(path, root)
    return path if rel == ".." or rel.startswith(".." + os.sep) else rel


def path_html(path: str, root: str) -> str:
    """A path as ``<code>`` relative to ``root``, the full path on hover."""
    return f'<code title="{esc(path)}">{esc(relative(path, root))}</code>'
