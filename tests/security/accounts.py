"""Two real Unix accounts in a setgid group folder, for the group-member threat tests.

The owner trains; the peer, a member of the same group, plants links, FIFOs and files in the
shared run directories. Both are created here (``groupadd`` / ``useradd``, names prefixed
``ckdsec`` so they collide with nobody), which needs root: CI runs the tests as root. Outside
CI a test without root is skipped saying so; with ``CI=true`` it fails instead.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Final

GROUP: Final = "ckdsec"
OWNER: Final = "ckdsec_owner"
PEER: Final = "ckdsec_peer"
HOW_TO_RUN: Final = "run the security tier as root (CI does: CI=true), which creates the accounts"
ROOT: Final = Path(__file__).resolve().parents[2]
CREATING_LOCK: Final = Path(tempfile.gettempdir()) / "ckdsec-accounts.lock"
"""Held while the accounts are looked up and created: both pytest-xdist workers import the
two-account modules at collection, and on a fresh machine the second ``useradd`` of a name
fails (exit 9, name in use) or finds /etc/passwd locked by the first."""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int


def require_accounts() -> tuple[Account, Account]:
    """The (owner, peer) accounts, created when missing; skips (fails with CI=true) without
    root or without ``useradd`` and ``setpriv``."""
    missing = [t for t in ("groupadd", "useradd", "setpriv") if shutil.which(t) is None]
    why = f"needs {', '.join(missing)}" if missing else "" if os.geteuid() == 0 else "needs root"
    if why:
        if os.environ.get("CI") == "true":
            raise RuntimeError(f"CI=true but the group-member tests cannot run: {why}")
        import pytest

        pytest.skip(f"two-account tests {why}; {HOW_TO_RUN}", allow_module_level=True)
    with open(CREATING_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(["groupadd", "-f", GROUP], check=True, capture_output=True)
        accounts = [_account(name) for name in (OWNER, PEER)]
    return accounts[0], accounts[1]


def _account(name: str) -> Account:
    """The account ``name``, created in ``GROUP`` when missing (the caller holds the lock)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "-M", "-N", "-g", GROUP, "-d", "/nonexistent", "-s", "/bin/sh", name],
            check=True,
            capture_output=True,
        )
        entry = pwd.getpwnam(name)
    return Account(name, entry.pw_uid, entry.pw_gid)


def as_user(
    account: Account, argv: list[str], *, timeout: float = 60, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``account`` (its uid, its group, umask 002 as on a shared project
    folder), with this checkout's ckptdash; a hang fails the test at ``timeout``."""
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": path,
        "HOME": "/nonexistent",
        "USER": account.name,
        "LOGNAME": account.name,
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    cmd = ["setpriv", f"--reuid={account.uid}", f"--regid={account.gid}", "--init-groups", *argv]
    return subprocess.run(
        cmd, cwd=cwd, env=env, umask=0o002, capture_output=True, text=True, timeout=timeout
    )


def python_as(
    account: Account, code: str, *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run Python ``code`` (with ``args`` in ``sys.argv[1:]``) as ``account``."""
    return as_user(account, [sys.executable, "-c", code, *args], timeout=timeout)
