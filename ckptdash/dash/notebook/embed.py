"""The notebook widget's document, embedded so that no text in it can end its ``<script>``.

Panel renders a widget as HTML holding one ``<script>`` whose source is the Bokeh document
written out as a JavaScript literal (``var docs_json = {...}``). Event text (a checkpoint path,
a signal name, an error) is inside that document, and the HTML parser ends a script at the first
``</script>`` whatever JavaScript string it sits in: a path naming ``</script><script>...``
would run as JavaScript in the user's notebook, next to their kernel. (The served app sends the
document over its websocket, not inside a page, so it never had this problem.)

The fix is at the one place text becomes script: the JSON. ``<``, ``>`` and ``&`` (and the two
line separators that end a JavaScript line in old parsers) are written as ``\\uXXXX`` escapes.
These characters occur in JSON only inside strings, where the escape means the same character,
so the document the browser builds is unchanged, and the script holds no ``<`` at all that an
HTML parser could read as a tag or a comment.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, Final

from ckptdash.errors import CkptDashError

_UNSAFE: Final = {
    "<": "\\u003c",
    ">": "\\u003e",
    "&": "\\u0026",
    "\u2028": "\\u2028",
    "\u2029": "\\u2029",
}
_UNSAFE_RE: Final = re.compile("[<>&\u2028\u2029]")
_install_lock = threading.Lock()


def script_safe_json(text: str) -> str:
    """JSON text that means the same but can sit inside an HTML ``<script>`` element.

    >>> script_safe_json('{"path": "</script>"}')
    '{"path": "\\\\u003c/script\\\\u003e"}'
    """
    return _UNSAFE_RE.sub(lambda m: _UNSAFE[m.group()], text)


def _safe(serialize: Callable[..., str]) -> Callable[..., str]:
    def serialize_json(obj: Any, *args: Any, **kwargs: Any) -> str:
        return script_safe_json(serialize(obj, *args, **kwargs))

    serialize_json._ckptdash_script_safe = True  # type: ignore[attr-defined]
    return serialize_json


def install() -> None:
    """Make Panel's notebook rendering write the document as script-safe JSON (idempotent).

    Panel's ``render_model`` looks ``serialize_json`` up in its module when it runs, so wrapping
    that name covers every widget this kernel renders, ckptdash's and any other.
    """
    from panel.io import notebook

    with _install_lock:
        if not getattr(notebook.serialize_json, "_ckptdash_script_safe", False):
            notebook.serialize_json = _safe(notebook.serialize_json)


def check_bundle(bundle: Any) -> Any:
    """Refuse a rendered widget whose script could be ended early by text inside it.

    A guard against a Panel release that no longer renders through the name :func:`install`
    wraps: the widget then fails to show, with this message, instead of running someone's
    script. Returns ``bundle``.
    """
    data = bundle[0] if isinstance(bundle, tuple) else bundle
    page = str(data.get("text/html", "")).lower() if isinstance(data, dict) else ""
    start = page.find("<script")
    if start >= 0:
        # Panel writes one script, last in the page: from its start tag to the page's last end
        # tag nothing may look like another tag or a comment.
        script = page[page.find(">", start) + 1 : page.rfind("</script")]
        if any(mark in script for mark in ("</script", "<script", "<!--")):
            raise CkptDashError(
                "the notebook widget's script would contain markup from the run's events;"
                " this Panel version renders widgets differently from the one ckptdash"
                " supports: install the Panel version in constraints-dev.txt"
            )
    return bundle
