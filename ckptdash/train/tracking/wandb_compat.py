"""Every touch of W&B's private API, in one place, with the releases it was written for.

Written and tested for wandb 0.31.0 (constraints-dev.txt). ckptdash needs one thing W&B
gives no public API for: whether this process already holds a connection to a W&B service
(:func:`service_connected`), so that :func:`~ckptdash.train.tracking.loggers.own_wandb_service`
knows whether taking ``WANDB_SERVICE`` out of the environment still changes anything. W&B
keeps the process's setup in ``wandb.sdk.wandb_setup._singleton``, with ``_connection`` and
the ``_pid`` it was made in.

A release without them reads as *not connected*: ckptdash then takes another process's
``WANDB_SERVICE`` out of the environment as it does before any ``wandb.init``, and the one
thing lost is the line saying that a connection made earlier keeps the old service. Nothing
wrong is done; ``tests/test_compat.py`` fails when another module names W&B's privates.

This module imports nothing of W&B: it reads the module only if the process imported it.
"""

from __future__ import annotations

import os
import sys
from typing import Final

TESTED: Final = "wandb 0.31.0"
"""The release this module was written and tested for."""


def service_connected() -> bool:
    """Whether this process (not a parent it was forked from) is connected to a W&B service."""
    setup = sys.modules.get("wandb.sdk.wandb_setup")
    singleton = getattr(setup, "_singleton", None)
    return (
        getattr(singleton, "_connection", None) is not None
        and getattr(singleton, "_pid", None) == os.getpid()
    )
