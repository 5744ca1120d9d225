"""The widget's comm routing outside a kernel: nothing happens, nothing breaks.

Inside a real kernel the routing is proven end to end by tests/notebooks/test_jupyterlab.py
(a click on Save now while another cell trains makes the job save).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ckptdash.dash.notebook.subshell import SubshellRoute


@dataclass
class FakeKernelComm:
    comm_id: str
    calls: list[Any] = field(default_factory=list)

    def _reply_subshell_for(self, data: Any, default: Any) -> Any:
        return default


@dataclass
class FakeClientComm:
    _comm: FakeKernelComm | None
    _on_msg: Any = None


def test_outside_a_kernel_no_comm_is_rerouted() -> None:
    """No kernel, no subshell: every comm keeps the kernel's own route (the main shell)."""
    comm = FakeKernelComm("c1")
    route = SubshellRoute()
    lock = threading.RLock()
    assert route.route([FakeClientComm(comm), FakeClientComm(None)], lock) == 0
    assert comm._reply_subshell_for({}, None) is None
    assert route.route([], lock) == 0
