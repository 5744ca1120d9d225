"""Every touch of the dashboard's frameworks' private API, in one place, with the releases it
was written for.

Written and tested for Panel 1.9.0 (pyproject's lower bound, ``make test-compat``) through
1.9.4 with the Bokeh each requires (3.8.0 through 3.9.2) and the Tornado Bokeh serves on, and,
in a notebook, pyviz_comms 3 with ipykernel 7.0 through 7.4.0 (constraints-dev.txt).

Older Panels, tried with torch 2.13 (2026-12-03): 1.4 has no ``panel.io.threads``
(:func:`stoppable_thread`); 1.5 to 1.8 have no ``owns_loop`` there (a served dashboard's loop
would never be closed), and 1.5 refuses a new ``name`` on a button (the controls' labels).
Bokeh 3.8.0 is the oldest that Panel 1.9.0 installs with (its panel-material-ui needs it).

The dashboard needs five things no public API gives: the thread ``pn.serve`` runs a server
in, the Tornado application behind
``pn.serve`` (to put the access gate in front of every handler), the comms a rendered
notebook widget holds (to know whether an update can be pushed, and to route its clicks to a
kernel subshell), one pane's property values as Panel computes them (to send only ``text``),
and whether the kernel runs subshells at all. The rest of the package calls these functions
and never names a private attribute of Panel, Bokeh, Tornado, pyviz_comms or ipykernel
(``tests/test_compat.py`` fails when one does). Each function says what it touches and what
happens when a release no longer has it: a :class:`~ckptdash.errors.FrameworkVersionError`
where going on would be wrong (a server without its gate), else a fallback stated in its
docstring that leaves the dashboard as it is without ckptdash's extra (a click that waits for
the training cell), never a silently wrong answer.

This module imports none of those frameworks: it is handed their objects.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Final

from ckptdash.errors import FrameworkVersionError

TESTED: Final = "Panel 1.9.0 to 1.9.4 (Bokeh 3.8.0 to 3.9.2), ipykernel 7.0 to 7.4.0"
"""The releases this module was written and tested for (said in every error it raises)."""


def tornado_app(server: Any) -> Any:
    """The Tornado application of a server ``pn.serve(..., start=False)`` returned (Bokeh's
    ``Server._tornado``), whose handlers the access gate wraps. Missing:
    :class:`FrameworkVersionError` — a server that cannot be gated is never started."""
    try:
        return server._tornado
    except AttributeError:
        raise FrameworkVersionError(
            f"ckptdash serve: this Bokeh's {type(server).__name__} has no _tornado, so its"
            f" handlers cannot be put behind ckptdash's access gate (tested with {TESTED}):"
            " install a tested release (pip install 'panel<=1.9.4' 'bokeh<=3.9.2')"
        ) from None


def stoppable_thread() -> Any:
    """Panel's ``StoppableThread`` (``panel.io.threads``; not in Panel's API reference), the
    thread ``pn.serve(threaded=True)`` runs a server in, which closes the loop it owns
    (``owns_loop``, Panel >= 1.9) when stopped. Missing: :class:`FrameworkVersionError`."""
    try:
        from panel.io.threads import StoppableThread
    except ImportError:
        StoppableThread = None
    if StoppableThread is None or "owns_loop" not in inspect.signature(StoppableThread).parameters:
        raise FrameworkVersionError(
            "ckptdash serve: this Panel has no panel.io.threads.StoppableThread(owns_loop=),"
            f" which ckptdash serves in (tested with {TESTED}): install a tested release"
            " (pip install 'panel>=1.9,<=1.9.4')"
        )
    return StoppableThread


def rendered_comms(viewable: Any) -> list[tuple[Any, Any]]:
    """The (server comm, client comm) pair of each notebook rendering of ``viewable``
    (Panel's ``Viewable._comms``). ``[]`` where a release has none (fallback: updates are
    pushed as before the first rendering, clicks are not routed to a subshell)."""
    comms = getattr(viewable, "_comms", None)
    return list(comms.values()) if comms else []


def push_comm_open(server_comm: Any) -> bool:
    """Whether a rendering's push comm is open (pyviz_comms ``Comm._comm`` is set); True where
    a release keeps no such attribute (fallback: the update is sent, as Panel would)."""
    return getattr(server_comm, "_comm", True) is not None


def kernel_comm(client_comm: Any) -> Any:
    """The ipykernel comm under a pyviz_comms client comm (``_comm``), or None before it opens."""
    return getattr(client_comm, "_comm", None)


def can_route(comm: Any) -> bool:
    """Whether this ipykernel comm can be routed to a subshell (ipykernel 7's per-comm reply
    route ``Comm._reply_subshell_for``). False where missing (fallback: not routed; clicks
    wait for the main thread, as without ckptdash)."""
    return hasattr(comm, "_reply_subshell_for")


def route_to_subshell(client_comm: Any, subshell: str, wrap: Callable[[Any], Any]) -> None:
    """Route the messages of ``client_comm`` to ``subshell``, each handled by ``wrap(handler)``
    (pyviz_comms ``_on_msg``, ipykernel ``Comm._reply_subshell_for``). Only for a comm
    :func:`can_route` said yes to."""
    handler = getattr(client_comm, "_on_msg", None)
    if handler is not None:
        client_comm._on_msg = wrap(handler)
    client_comm._comm._reply_subshell_for = lambda data, default, sid=subshell: sid


def kernel_runs_subshells(kernel: Any) -> bool:
    """Whether this ipykernel kernel runs subshells (``_supports_kernel_subshells``); False
    where a release has no such flag (fallback: no subshell, clicks wait)."""
    return bool(getattr(kernel, "_supports_kernel_subshells", False))


def pane_properties(pane: Any, document: Any) -> dict[str, Any]:
    """The Bokeh properties Panel computes for ``pane`` in ``document`` (its
    ``_get_properties``), for a pane that overrides Panel's ``_update`` hook to send fewer.
    Missing: :class:`FrameworkVersionError` (the pane would otherwise never update)."""
    try:
        get = pane._get_properties
    except AttributeError:
        raise FrameworkVersionError(
            f"ckptdash: this Panel's {type(pane).__name__} has no _get_properties, which"
            f" ckptdash's text panes update through (tested with {TESTED}): install a tested"
            " release (pip install 'panel<=1.9.4')"
        ) from None
    properties: dict[str, Any] = get(document)
    return properties
