"""The few torch.distributed operations the engine needs, each a no-op with one process.

Nothing here runs per step: the agreement is one ``all_reduce`` of four
integers, made every ``check_every`` steps by every rank at the same step.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

from ckptdash.errors import ConfigError

T = TypeVar("T")


def _initialized() -> bool:
    try:
        import torch.distributed as torch_dist
    except ImportError:  # pragma: no cover - torch is a dependency
        return False
    return bool(torch_dist.is_available() and torch_dist.is_initialized())


def rank() -> int:
    """Global rank: from torch.distributed if initialised, else the launcher's variables."""
    if _initialized():
        import torch.distributed as torch_dist

        return int(torch_dist.get_rank())
    for name in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(name)
        if value and value.isdigit():
            return int(value)
    return 0


def world_size() -> int:
    """Number of ranks: from torch.distributed if initialised, else 1."""
    if _initialized():
        import torch.distributed as torch_dist

        return int(torch_dist.get_world_size())
    return 1


def launched_world_size() -> int:
    """Number of ranks the launcher (torchrun and the like) says the job has; 1 if it says none."""
    value = os.environ.get("WORLD_SIZE", "")
    return int(value) if value.isdigit() else 1


def _device() -> Any:
    import torch
    import torch.distributed as torch_dist

    # NCCL only reduces CUDA tensors; gloo and others take CPU tensors.
    if torch_dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def agree_max(values: list[int]) -> list[int]:
    """Element-wise maximum of ``values`` over all ranks (the values themselves with one rank)."""
    if not _initialized() or world_size() == 1:
        return values
    import torch
    import torch.distributed as torch_dist

    # Looked up at every call, not cached: a job may destroy its process group and make a
    # new one (another backend, another device) between two agreements.
    tensor = torch.tensor(values, dtype=torch.int64, device=_device())
    torch_dist.all_reduce(tensor, op=torch_dist.ReduceOp.MAX)
    return [int(x) for x in tensor.tolist()]


def broadcast_int(value: int) -> int:
    """Rank 0's ``value`` on every rank."""
    if not _initialized() or world_size() == 1:
        return value
    return agree_max([value if rank() == 0 else -(2**62)])[0]


def broadcast_object(obj: T) -> T:
    """Rank 0's picklable ``obj`` on every rank."""
    if not _initialized() or world_size() == 1:
        return obj
    import torch.distributed as torch_dist

    box: list[Any] = [obj]
    torch_dist.broadcast_object_list(box, src=0)
    return box[0]  # type: ignore[no-any-return]


def check_initialised(world: int) -> None:
    """Refuse to run ranks that would each decide alone: a launcher started several ranks
    (``WORLD_SIZE``) but the process group is not initialised, so a signal on one rank would
    stop it and leave the others hanging in their next collective."""
    launched = launched_world_size()
    if world == 1 and launched > 1:
        raise ConfigError(
            f"the launcher started {launched} ranks (WORLD_SIZE={launched}) but"
            " torch.distributed is not initialised: call"
            " torch.distributed.init_process_group() before creating ckptdash.Monitor,"
            " so that all ranks agree on when to save and stop"
        )
