"""DeepSpeed on the CPU accelerator without the two costs these tests never use.

Called by a DeepSpeed test worker before it imports DeepSpeed (or Lightning's strategy for it).
"""

from __future__ import annotations

import sys


def lean_deepspeed() -> None:
    """Leave out DeepSpeed's mlflow import and its shared-memory collective.

    - Its autotuner imports mlflow when it is installed (~4 s of CPU a rank): blocked, it is the
      ImportError DeepSpeed expects without mlflow.
    - Its CPU accelerator compiles a shared-memory allreduce (``deepspeed_shm_comm``) at the
      first start on a machine: ~1.5 CPU-minutes, and four minutes of wall when a loaded suite
      shares the cores, for a collective no checkpoint here depends on. Marked incompatible, it
      is left out and the collectives go through gloo, as on a platform without the op
      (``deepspeed.comm.torch.build_shm_op``). GPU clusters never build it either.
    """
    sys.modules.setdefault("mlflow", None)  # type: ignore[arg-type]
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
