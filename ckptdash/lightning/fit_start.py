"""What happens at ``fit()``'s start, before any callback hook: ``ckpt_path="hpc"`` and an
attempt that fails there.

Lightning resolves ``ckpt_path`` before it calls a single callback. ``"hpc"`` asks for its
``hpc_ckpt_N`` files, which ckptdash's own signal saves replace (it stops Lightning's): so
``"hpc"`` means ckptdash's resume rule, said in one line, instead of Lightning's
``ValueError ... no HPC checkpoint was found`` at every attempt. An error before the
callback's ``setup`` (a refused ``ckpt_path``, a misconfigured Trainer) is still this run's
attempt: it is recorded as one that failed, with the error, so ``status`` never hides a job
that died at start.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any, Final

from ckptdash.lightning import compat

HPC_LINE: Final = (
    'ckptdash: fit(ckpt_path="hpc") resumes by ckptdash\'s resume rule (its signal saves'
    " replace Lightning's hpc_ckpt_N files; docs/resume-rule.md)"
)


def install_fit_start_hook(
    find: Callable[[Any], Any], failed_at_start: Callable[[Any, Any, BaseException], None]
) -> None:
    """Wrap Lightning's fit implementation once per process (:func:`compat.wrap_fit_impl`).
    ``find(trainer)`` is the trainer's ckptdash callback or None;
    ``failed_at_start(callback, trainer, error)`` records a fit that raised before the
    callback's setup (it tells by itself)."""
    compat.wrap_fit_impl(lambda original: _wrapped(original, find, failed_at_start))


def _wrapped(
    original: Callable[..., Any],
    find: Callable[[Any], Any],
    failed_at_start: Callable[[Any, Any, BaseException], None],
) -> Callable[..., Any]:
    signature = inspect.signature(original)

    def fit_impl(self: Any, *args: Any, **kwargs: Any) -> Any:
        callback = find(self)
        if callback is None:
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        if bound.arguments.get("ckpt_path") == "hpc":
            bound.arguments["ckpt_path"] = None  # the callback's resume hook applies the rule
            if getattr(self, "is_global_zero", True):
                print(HPC_LINE, file=sys.stderr, flush=True)
        try:
            return original(*bound.args, **bound.kwargs)
        except BaseException as exc:
            failed_at_start(callback, self, exc)
            raise

    return fit_impl
