"""Record an exception that ends a script as the attempt's failure (``sys.excepthook``).

A flat script (a ``Monitor`` without a ``with`` block) that raises never reaches
``monitor.close()``: without this its attempt would look running until the next attempt marks
it lost. The Monitor chains an :class:`ExceptHook` into ``sys.excepthook`` while it is open;
the hook records the failure, then hands the exception to the hook that was there before
(which prints the traceback as usual).
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any


class ExceptHook:
    """Calls ``record(error)`` (a bound method) for an uncaught exception, once, until
    :meth:`uninstall`. It holds the method's object weakly: a Monitor nobody refers to any
    more is not kept alive (with its open event file) by the hook."""

    def __init__(self, record: Callable[[BaseException], None]) -> None:
        self._record: weakref.WeakMethod[Callable[[BaseException], None]] | None = (
            weakref.WeakMethod(record)
        )
        self._previous: Any = None

    def install(self) -> ExceptHook:
        self._previous = sys.excepthook
        sys.excepthook = self
        return self

    def uninstall(self) -> None:
        self._record = None  # harmless from now on, even if another hook chained after us
        if sys.excepthook is self:
            sys.excepthook = self._previous

    def __call__(
        self, kind: type[BaseException], error: BaseException, tb: TracebackType | None
    ) -> None:
        ref, self._record = self._record, None
        record = ref() if ref is not None else None
        if record is not None:
            with contextlib.suppress(Exception):  # the traceback must still be printed
                record(error)
        previous = self._previous if self._previous is not None else sys.__excepthook__
        previous(kind, error, tb)
