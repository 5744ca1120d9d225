"""What ``ckptdash serve`` says when it cannot start, without importing Panel (the CLI checks
the port before it loads the dashboard)."""

from __future__ import annotations


def port_in_use(address: str, port: int) -> str:
    """What to do when ``port`` is taken."""
    return (
        f"port {port} on {address} is in use (by another program, or another ckptdash serve);"
        " choose one with --port N, or --port 0 for any free port"
    )
