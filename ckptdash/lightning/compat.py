"""The Lightning classes ckptdash uses, from ``lightning.pytorch`` or, if that is missing,
``pytorch_lightning``."""

from __future__ import annotations

__all__ = [
    "AsyncCheckpointIO",
    "CheckpointIO",
    "DeepSpeedStrategy",
    "EarlyStopping",
    "FSDPStrategy",
    "ModelCheckpoint",
    "ModelParallelStrategy",
    "OnExceptionCheckpoint",
    "Strategy",
    "TorchCheckpointIO",
    "pl",
]

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, OnExceptionCheckpoint
    from lightning.pytorch.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO
    from lightning.pytorch.strategies import (
        DeepSpeedStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
        Strategy,
    )
except ImportError:  # pragma: no cover - exercised only where the old package name is installed
    # The old package name ships the same classes; mypy sees them as distinct types.
    import pytorch_lightning as pl  # type: ignore[no-redef,unused-ignore]
    from pytorch_lightning.callbacks import (  # type: ignore[assignment,unused-ignore]
        EarlyStopping,
        ModelCheckpoint,
        OnExceptionCheckpoint,
    )
    from pytorch_lightning.plugins.io import (  # type: ignore[assignment,unused-ignore]
        AsyncCheckpointIO,
        CheckpointIO,
        TorchCheckpointIO,
    )
    from pytorch_lightning.strategies import (  # type: ignore[assignment,unused-ignore]
        DeepSpeedStrategy,
        FSDPStrategy,
        ModelParallelStrategy,
        Strategy,
    )
