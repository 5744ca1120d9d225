"""Training-side cost per step: the Lightning callback, and ``Session.boundary()`` alone.

(a) A tiny model (one Linear layer, logs its loss each step, ~1 ms a step) fits on
the CPU with the same Trainer: with ``CkptDashCallback`` (default configuration,
run directory in a temp folder), without it, and with an empty ``pl.Callback``.
Progress bar, logger, model summary, checkpointing and validation are off. A
timing callback, in all, measures the steps after a warm-up. Fits alternate.
Whole fits differ by ±1–2 % from one to the next here, more than the goal, so
this row is for scale; (b) is the measurement the goal is judged on.

(b) The same comparison inside one fit: the callback list is swapped every 20
steps (none / empty callback / ckptdash, order rotating), and the ratio is the
median of the per-round ratios, with a 95 % bootstrap interval. Goal: ≤ 1.005×.
This also splits the overhead into Lightning's dispatch (paid by any callback
with a per-step hook) and ckptdash's own check, which is then timed directly.

``BENCH_STEP_LOGGER=csv`` (or ``tensorboard``) gives every fit that Lightning logger
(logging every 50 steps, Lightning's default): ckptdash then also continues the logger's run
(docs/loggers.md), which must add nothing per step.

(c) ``Session.boundary()`` on its no-op path (the countdown not yet at zero),
in ns per call, against an empty method of the same signature: the per-step
cost of ``ckptdash.Monitor`` in a plain PyTorch loop.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
import warnings
from typing import Any, cast

import lightning.pytorch as pl
import torch
from timing import Row, interleave, median, paired, paired_interval, spread
from torch.utils.data import DataLoader, TensorDataset

from ckptdash.lightning import CkptDashCallback
from ckptdash.train.config import TrainConfig
from ckptdash.train.engine.session import Session

BATCH = 32
FEATURES = 32


def _logger(tmp: str) -> Any:
    """False (no logger), or the Lightning logger ``BENCH_STEP_LOGGER`` names."""
    kind = os.environ.get("BENCH_STEP_LOGGER", "")
    if kind == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(tmp)
    if kind == "tensorboard":
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(tmp)
    return False


class TinyModel(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(FEATURES, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StepTimer(pl.Callback):
    """Time from the end of step ``warmup`` to the end of the last step."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.start = self.end = 0.0

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.warmup:
            self.start = time.perf_counter()
        elif trainer.global_step == trainer.max_steps:
            self.end = time.perf_counter()


class _Nothing(pl.Callback):
    """A callback that does nothing: what Lightning itself charges per extra callback."""


def _fit(steps: int, warmup: int, extra: str) -> float:
    """Seconds per step of one fit() after the warm-up."""
    torch.manual_seed(0)
    n = (steps + warmup) * BATCH
    data = DataLoader(TensorDataset(torch.randn(n, FEATURES), torch.randn(n, 1)), batch_size=BATCH)
    timer = StepTimer(warmup)
    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-step-") as tmp:
        callbacks: list[pl.Callback] = [timer]
        if extra == "ckptdash":
            callbacks.append(CkptDashCallback(run_dir=f"{tmp}/run"))
        elif extra == "empty":
            callbacks.append(_Nothing())
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=steps + warmup,
            callbacks=callbacks,
            default_root_dir=tmp,
            enable_progress_bar=False,
            logger=_logger(tmp),
            enable_model_summary=False,
            enable_checkpointing=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
        )
        trainer.fit(TinyModel(), train_dataloaders=data)
    if not timer.end:
        raise AssertionError("the timed steps did not all run")
    return (timer.end - timer.start) / steps


class BlockToggler(pl.Callback):
    """Within one fit, take turns in blocks of steps: no callback, an empty one, ckptdash's.

    The list ``trainer.callbacks`` is replaced (not mutated) at the end of a block, from
    the last position, so every step of a block ran under one setting only.
    """

    def __init__(self, extra: dict[str, pl.Callback], warmup: int, block: int) -> None:
        self.extra, self.warmup, self.block = extra, warmup, block
        self.order = ["none", *extra]
        self.times: dict[str, list[float]] = {name: [] for name in self.order}
        self.turn = 0
        self.mark = 0.0
        self.current = "none"
        self.check_s = self.metrics_read_s = 0.0

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = trainer.global_step
        if step < self.warmup or (step - self.warmup) % self.block:
            return
        now = time.perf_counter()
        if step > self.warmup:
            self.times[self.current].append((now - self.mark) / self.block)
        # Rotate the order every round so no setting always follows the same one.
        rnd, pos = divmod(self.turn, len(self.order))
        self.current = self.order[(pos + rnd) % len(self.order)]
        self.turn += 1
        chosen = [self.extra[self.current]] if self.current in self.extra else []
        trainer.callbacks = [*chosen, self]
        if step == self.warmup:
            self._time_check(trainer, pl_module, outputs, batch, batch_idx)
        self.mark = time.perf_counter()

    def _time_check(self, trainer: Any, *args: Any) -> None:
        """Time the check ckptdash makes about once a period (its hook is off in between),
        and one read of Lightning's metrics property for scale."""
        calls, ckptdash = 1000, cast(CkptDashCallback, self.extra["ckptdash"])
        check_s, read_s = [], []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                # A whole check: signals, the throttled inbox poll and heartbeat, the decision.
                ckptdash._timed_check(trainer, *args)
            check_s.append((time.perf_counter() - start) / calls)
            start = time.perf_counter()
            for _ in range(calls):
                trainer.callback_metrics  # noqa: B018 - the property read is what is timed
            read_s.append((time.perf_counter() - start) / calls)
        self.check_s, self.metrics_read_s = median(check_s), median(read_s)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        # Whatever the last turn was, ckptdash's callback ends and tears down as usual.
        ckptdash = self.extra["ckptdash"]
        if self.current != "ckptdash":
            ckptdash.on_train_end(trainer, pl_module)
        trainer.callbacks = [ckptdash, self]


def _fit_blocks(rounds: int, block: int, warmup: int) -> BlockToggler:
    """One fit that takes turns; the toggler holds the seconds per step of each block."""
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-blocks-") as tmp:
        ckptdash = CkptDashCallback(run_dir=f"{tmp}/run")
        toggler = BlockToggler({"empty": _Nothing(), "ckptdash": ckptdash}, warmup, block)
        steps = warmup + rounds * 3 * block
        n = steps * BATCH
        data = DataLoader(
            TensorDataset(torch.randn(n, FEATURES), torch.randn(n, 1)), batch_size=BATCH
        )
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=steps,
            callbacks=[ckptdash, toggler],  # ckptdash sets up its session; then turns begin
            default_root_dir=tmp,
            enable_progress_bar=False,
            logger=_logger(tmp),
            enable_model_summary=False,
            enable_checkpointing=False,
            limit_val_batches=0,
            num_sanity_val_steps=0,
        )
        trainer.fit(TinyModel(), train_dataloaders=data)
    return toggler


def _pulse_tick_us(session: Session) -> float:
    """The pulse thread's work per tick, timed directly (what it takes from training)."""
    pulser = session._pulser
    if pulser is None:
        raise AssertionError("the session has no pulse thread (pulse_interval_s = 0?)")
    per_tick = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(1000):
            pulser.tick()
        per_tick.append((time.perf_counter() - start) / 1000)
    return median(per_tick) * 1e6


class _Empty:
    def boundary(
        self, step: int, epoch: int | None = None, metrics: dict[str, Any] | None = None
    ) -> None:
        return None


def _boundary_ns(session: Session | _Empty, calls: int) -> float:
    if isinstance(session, Session):
        session._cadence.check_in(calls + 2)  # stay on the no-op path for the whole loop
    boundary = session.boundary
    start = time.perf_counter_ns()
    for step in range(calls):
        boundary(step, 0, None)
    return (time.perf_counter_ns() - start) / calls


def run(quick: bool) -> list[Row]:
    steps, warmup, reps = (300, 50, 2) if quick else (2000, 200, 4)
    rounds, block = (40, 20) if quick else (1000, 20)
    calls, call_reps = (200_000, 3) if quick else (1_000_000, 7)
    warnings.filterwarnings("ignore")  # "no workers in the DataLoader" and the like
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        logging.getLogger(name).setLevel(logging.ERROR)
    torch.set_num_threads(1)

    _fit(warmup, warmup, "ckptdash")  # first-use costs (imports, allocator) in no contender
    fits = interleave(
        {
            "with": lambda: _fit(steps, warmup, "ckptdash"),
            "without": lambda: _fit(steps, warmup, "none"),
            "empty": lambda: _fit(steps, warmup, "empty"),
        },
        reps,
    )
    ms = {k: median(v) * 1e3 for k, v in fits.items()}
    toggler = _fit_blocks(rounds, block, warmup)
    turns = toggler.times
    bms = {k: median(v) * 1e3 for k, v in turns.items()}
    in_fit = paired(turns["ckptdash"], turns["none"])
    low, high = paired_interval(turns["ckptdash"], turns["none"])
    lightning_tax = paired(turns["empty"], turns["none"])
    own = paired(turns["ckptdash"], turns["empty"])

    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-boundary-") as tmp:
        session = Session(TrainConfig(run_dir=tmp))
        session.start(install_signals=False)
        empty = _Empty()
        ns = interleave(
            {
                "session": lambda: _boundary_ns(session, calls),
                "empty": lambda: _boundary_ns(empty, calls),
            },
            call_reps,
        )
        pulse_us = _pulse_tick_us(session)
        session.close()
    cost = {k: median(v) for k, v in ns.items()}
    ratio = paired(fits["with"], fits["without"])
    metrics_us, check_us = toggler.metrics_read_s * 1e6, toggler.check_s * 1e6
    extra_us = (bms["ckptdash"] - bms["none"]) * 1e3
    return [
        Row(
            f"step: separate fits with vs without CkptDashCallback, tiny CPU model, ms/step"
            f" ({steps} steps × {reps} alternating fits each, median; {spread(fits['with'])})",
            f"{ms['with']:.4f} ms ({(ms['with'] - ms['without']) * 1e3:+.1f} µs)",
            f"{ms['without']:.4f} ms (same Trainer, no callback; with an empty pl.Callback:"
            f" {paired(fits['empty'], fits['without']):.3f}×)",
            ratio,
            "— (for scale; see the next row)",
        ),
        Row(
            f"step: one fit taking turns in {block}-step blocks, ms/step ({rounds} rounds;"
            f" ratio = median of per-round ratios, 95 % interval {low:.4f}–{high:.4f};"
            f" {spread(turns['ckptdash'])})",
            f"{bms['ckptdash']:.4f} ms ({extra_us:+.1f} µs)",
            f"{bms['none']:.4f} ms (no callback)",
            in_fit,
            "≤ 1.005×",
            in_fit <= 1.005,
        ),
        Row(
            "step: same turns, CkptDashCallback vs an empty pl.Callback (what is left is"
            " Lightning's dispatch cost, paid by any callback)",
            f"{bms['ckptdash']:.4f} ms",
            f"{bms['empty']:.4f} ms (empty callback; {lightning_tax:.3f}× no callback)",
            own,
        ),
        Row(
            "step: the check CkptDashCallback makes about once a second (and at the step after"
            " a signal), called directly, µs/call (5 × 1000 calls, median; ratio: its share"
            " of a step if it ran at every step)",
            f"{check_us:.1f} µs (for scale: one read of trainer.callback_metrics is"
            f" {metrics_us:.1f} µs)",
            f"{bms['none'] * 1e3:.0f} µs (one step, no callback)",
            check_us / (bms["none"] * 1e3),
        ),
        Row(
            "pulse: one tick of a rank's pulse thread (a pulse event appended, no fsync),"
            " µs/tick (5 × 1000 ticks, median; ratio: the share of a second it holds the"
            " interpreter at the default pulse_interval_s = 1 s; it runs besides the steps,"
            " never in them)",
            f"{pulse_us:.1f} µs",
            "1 s (the pulse period)",
            1.0 + pulse_us * 1e-6,
            "≤ 1.005×",
            pulse_us * 1e-6 <= 0.005,
        ),
        Row(
            f"Session.boundary() no-op path, ns/call ({calls:,} calls × {call_reps}, median)",
            f"{cost['session']:.0f} ns",
            f"{cost['empty']:.0f} ns (empty method, same signature)",
            paired(ns["session"], ns["empty"]),
        ),
    ]
