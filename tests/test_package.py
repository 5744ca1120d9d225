"""What ``import ckptdash`` gives a user: a light import, and the framework modules by name."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip()


def test_import_ckptdash_loads_no_framework_and_no_panel() -> None:
    """``import ckptdash`` in a training script imports neither Panel nor any framework:
    a plain loop pays for none of them."""
    loaded = _run(
        "import sys, ckptdash; "
        "print(sorted(m for m in ('panel', 'transformers', 'accelerate', 'lightning', 'submitit')"
        " if m in sys.modules))"
    )
    assert loaded == "[]"


def test_framework_modules_load_when_first_named() -> None:
    """``ckptdash.hf.CkptDashCallback`` and the other framework helpers work after a bare
    ``import ckptdash``, as the README writes them."""
    names = _run(
        "import ckptdash; "
        "print(ckptdash.hf.CkptDashCallback.__name__, ckptdash.dcp.save.__name__,"
        " ckptdash.accelerate.save_state.__name__, ckptdash.submitit.preemptible.__name__,"
        " ckptdash.lightning.CkptDashCallback.__name__, ckptdash.fabric.FabricMonitor.__name__,"
        " ckptdash.deepspeed.save_checkpoint.__name__)"
    )
    assert names == (
        "CkptDashCallback save save_state preemptible CkptDashCallback FabricMonitor"
        " save_checkpoint"
    )


def test_public_surface_is_pinned() -> None:
    """``ckptdash.__all__`` is the deliberate surface: what a training script uses, sorted.
    A name added or dropped here is an API change to make on purpose (and to document)."""
    import ckptdash

    assert ckptdash.__all__ == [
        "Alert",
        "CheckpointChoiceError",
        "CkptDashError",
        "ConfigError",
        "EventValidationError",
        "Monitor",
        "ResumeChoice",
        "RunDirError",
        "RunGoodput",
        "RunState",
        "SaveError",
        "TrainConfig",
        "alerts",
        "checkpoints",
        "choose_resume",
        "dashboard",
        "goodput",
        "load_state",
        "resume_path",
        "status",
        "write_sample_run",
    ]
    assert all(getattr(ckptdash, name) is not None for name in ckptdash.__all__)


def test_every_exception_derives_from_ckptdash_error() -> None:
    """Every exception class ckptdash defines is a :class:`~ckptdash.CkptDashError` defined in
    ``ckptdash.errors``, so one ``except`` catches every deliberate error and one module lists
    them all, its tree naming each."""
    import importlib
    import inspect
    import pkgutil

    import ckptdash
    from ckptdash import errors

    # Every module but the framework and dashboard ones (heavy libraries; main.py is an app).
    heavy = {
        "_dev",
        "accelerate",
        "dash",
        "dcp",
        "deepspeed",
        "demo_train",
        "hf",
        "lightning",
        "main",
        "submitit",
    }
    light = [
        m.name
        for m in pkgutil.walk_packages(ckptdash.__path__, "ckptdash.")
        if m.name.split(".")[1] not in heavy and m.name != "ckptdash.__main__"
    ]
    found = {
        cls
        for name in light
        for _, cls in inspect.getmembers(importlib.import_module(name), inspect.isclass)
        if issubclass(cls, Exception) and cls.__module__.startswith("ckptdash")
    }
    assert found, "no exception classes found"
    assert all(issubclass(cls, ckptdash.CkptDashError) for cls in found)
    assert {c.__name__ for c in found if c.__module__ != "ckptdash.errors"} == set()
    tree = errors.__doc__ or ""
    assert all(cls.__name__ in tree for cls in found)
