"""The framework tier's summary: what the DeepSpeed tests cost (docs/frameworks.md quotes it)."""

from __future__ import annotations

from typing import Any

DEEPSPEED_COSTS: list[tuple[str, float]] = []
"""(test name, wall seconds) of each DeepSpeed test run in this session."""


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not DEEPSPEED_COSTS:
        return
    total = sum(s for _, s in DEEPSPEED_COSTS)
    terminalreporter.section("DeepSpeed tier: cost")
    for name, seconds in DEEPSPEED_COSTS:
        terminalreporter.write_line(f"{name}: {seconds:.0f} s")
    terminalreporter.write_line(f"total: {total:.0f} s (op compilation cached in ~/.cache)")
