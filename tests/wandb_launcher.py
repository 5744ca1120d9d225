"""A launcher process that holds a W&B service, as one that called ``wandb.setup()`` before
starting its workers does (used by the W&B service tests).

Prints the ``WANDB_SERVICE`` token its children would inherit, then keeps the service until
its stdin is closed. It runs apart from the test process so that process's own W&B state
(settings W&B reads once per process) is left alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def launcher_service(env: dict[str, str]) -> Iterator[str]:
    """Start the launcher with ``env``; yield its ``WANDB_SERVICE`` token; stop it."""
    proc = subprocess.Popen(
        [sys.executable, __file__], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdin is not None
        token = proc.stdout.readline().strip()
        assert token.startswith("3-"), f"the launcher printed no W&B service token: {token!r}"
        yield token
        proc.stdin.close()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    import wandb

    wandb.setup()
    print(os.environ["WANDB_SERVICE"], flush=True)
    sys.stdin.read()
    wandb.teardown()
