"""A tiny Hugging Face Trainer job (no downloads): a 1-layer BERT built from a config, and
callbacks the 2-rank test (hf_logger_worker.py under torchrun) uses."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class RandomTokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Random token ids and labels, the same on every rank and every attempt."""

    def __init__(self, n: int = 256, length: int = 8, vocab: int = 32) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)
        self.labels = torch.randint(0, 2, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.labels[i]}


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=32,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    config.num_labels = 2
    return BertForSequenceClassification(config)


def trainer(
    out_dir: Path, *, steps: int, callbacks: list[Any], save_steps: int = 1000, **args: Any
) -> Trainer:
    """A Trainer for ``steps`` steps of the tiny BERT on CPU, logging every step."""
    args.setdefault("logging_steps", 1)
    args.setdefault("report_to", [])
    targs = TrainingArguments(
        output_dir=str(out_dir),
        max_steps=steps,
        per_device_train_batch_size=4,
        save_strategy="steps",
        save_steps=save_steps,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        learning_rate=1e-3,
        **args,
    )
    return Trainer(model=tiny_bert(), args=targs, train_dataset=RandomTokens(), callbacks=callbacks)


class SignalAt(TrainerCallback):
    """Rank 1 alone sends itself SIGUSR2 at the end of step ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step and args.process_index == 1:
            os.kill(os.getpid(), signal.SIGUSR2)


class StartedAt(TrainerCallback):
    """Each rank writes the step its training starts from to ``RUN_DIR.start<rank>``."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        Path(f"{self.run_dir}.start{args.process_index}").write_text(str(state.global_step))
