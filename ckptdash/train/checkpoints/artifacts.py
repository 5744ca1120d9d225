"""Which saves of a plain loop resume training, and which are artifacts.

The caller says so (``monitor.save(state, resumable=False)``); else the object does: a
model (``nn.Module``) or what ``model.state_dict()`` returns (torch's ``OrderedDict`` of
tensors, with its ``_metadata``) holds no optimizer or loop state, so it is an artifact.
Any other object — a dict such as ``{"model": ..., "opt": ..., "step": ...}``, or a dict of
tensors of the user's own (``{"w": w}``: a toy loop's whole state) — is taken to resume
training: ckptdash cannot know what a dict of the user's means, and treats it as
every save was treated before. A dict of model weights and a step but no optimizer state
resumes only the model: say ``resumable=False`` if it must never be resumed from
(docs/resume-rule.md, Two kinds of checkpoint).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, Final

SAID_SO: Final = "saved with resumable=False"
MODEL_ALONE: Final = "a model alone: no optimizer or loop state"
STATE_DICT_ALONE: Final = "a model's state_dict alone: no optimizer or loop state"


def artifact_of(state: Any, resumable: bool | None) -> str | None:
    """Why ``state`` cannot resume training (the record's ``artifact``), or None."""
    if resumable is not None:
        return None if resumable else SAID_SO
    torch = sys.modules.get("torch")
    if torch is None:
        return None  # no torch loaded: no tensor and no module in it either
    if isinstance(state, torch.nn.Module):
        return MODEL_ALONE
    # Module.state_dict() returns an OrderedDict carrying _metadata (each submodule's
    # version): a dict the user built has none, and may well be a whole loop's state.
    from_module = isinstance(state, Mapping) and hasattr(state, "_metadata") and state
    if from_module and all(isinstance(v, torch.Tensor) for v in state.values()):
        return STATE_DICT_ALONE
    return None
