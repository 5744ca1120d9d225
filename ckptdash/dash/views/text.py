"""How paths and text read on the dashboard (HTML-safe). Sizes, durations, times and numbers:
:mod:`ckptdash.humanize`, shared with the command line."""

from __future__ import annotations

import html
import os


def esc(value: object) -> str:
    """``value`` as text that is safe inside HTML (paths and reasons come from files)."""
    return html.escape(str(value), quote=True)


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
