"""The framework tier needs transformers and accelerate (the test extra): without them the
tests skip, saying how to install them; with CI=true they fail instead, so CI never skips."""

from __future__ import annotations

import importlib
import os

import pytest


def require(*modules: str) -> None:
    """Skip the calling test module (fail under CI=true) unless every module imports."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            why = f"{name} is not importable ({exc}): pip install -e '.[test]'"
            if os.environ.get("CI") == "true":
                pytest.fail(f"the framework tier must run in CI (CI=true), but {why}", False)
            pytest.skip(why, allow_module_level=True)
