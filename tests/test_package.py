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
        " ckptdash.lightning.CkptDashCallback.__name__)"
    )
    assert names == "CkptDashCallback save save_state preemptible CkptDashCallback"
