"""Step cost of ``ckptdash.hf.CkptDashCallback`` in a real Hugging Face Trainer.

One ``train()`` of a 1-layer BERT built from a config (vocabulary 32, hidden size 16,
batch 4, CPU, no saves, logging every 10 steps). A timing callback swaps the
Trainer's callback list every 20 steps between *without* and *with* ckptdash's
callback (default configuration, run directory in a temp folder; the order
alternates) and times each round of 20 steps. The ratio is the median of the
per-pair ratios (with its 95 % bootstrap interval). Rounds are timed in this
thread's CPU time, with torch on one thread, so other processes on a shared
machine do not count. Goal: ≤ 1.005×.

(b) What the callback adds to a step, timed directly: the Trainer's four per-step
events (``on_step_begin``, ``on_pre_optimizer_step``, ``on_optimizer_step``,
``on_step_end``) dispatched by its own ``CallbackHandler`` with and without
ckptdash's callback in the list, on the no-op path, in µs per step; the ratio is
(step + that) ÷ step with the step time measured in (a).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from timing import Row, median, paired, paired_interval, spread

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROUND = 20
GOAL = 1.005
EVENTS = ("on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end")


def _dispatch_cost(
    handler: Any, ours: Any, empty: Any, swapper: Any, state: Any, n: int
) -> dict[str, float]:
    """Seconds per step of the per-step events: without a further callback, with an empty
    ``TrainerCallback`` and with ``ours`` (taking turns)."""
    base = [c for c in handler.callbacks if c is not ours and c is not swapper]
    variants = {"none": base, "empty": [*base, empty], "ckptdash": [*base, ours]}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for rep in range(12):
        names = list(variants)
        for name in names[rep % 3 :] + names[: rep % 3]:
            handler.callbacks = variants[name]
            began = time.thread_time()
            for _ in range(n):
                for event in EVENTS:
                    handler.call_event(event, _ARGS[0], state, _CONTROL[0])
            times[name].append((time.thread_time() - began) / n)
    return {name: median(t) for name, t in times.items()}


_ARGS: list[Any] = []
_CONTROL: list[Any] = []


def run(quick: bool) -> list[Row]:
    import torch
    from transformers import TrainerCallback
    from transformers.utils import logging as hf_logging

    from ckptdash.hf import CkptDashCallback
    from tests.frameworks.hf_tiny import trainer

    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()  # type: ignore[no-untyped-call]
    logging.getLogger("ckptdash").setLevel(logging.ERROR)
    pairs = 15 if quick else 100
    warmup = 2

    class Swapper(TrainerCallback):
        def __init__(self, ours: Any) -> None:
            self.ours = ours
            self.handler: Any = None
            self.times: dict[str, list[float]] = {"none": [], "ckptdash": []}
            self.current = "ckptdash"
            self.began = 0.0
            self.round = 0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step % ROUND:
                return
            now = time.thread_time()
            if self.round >= warmup:
                self.times[self.current].append(now - self.began)
            self.round += 1
            pair, second = divmod(self.round, 2)
            first = "none" if pair % 2 else "ckptdash"
            self.current = first if not second else ({"none", "ckptdash"} - {first}).pop()
            others = [c for c in self.handler.callbacks if c is not self.ours]
            # A new list: the handler is iterating over the old one right now.
            self.handler.callbacks = others + ([self.ours] if self.current == "ckptdash" else [])
            self.began = time.thread_time()

    with tempfile.TemporaryDirectory(prefix="ckptdash-bench-") as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours = CkptDashCallback(Path(tmp) / "run")
        swapper = Swapper(ours)
        steps = ROUND * (2 * pairs + warmup + 1)
        t = trainer(Path(tmp) / "out", steps=steps, callbacks=[swapper, ours], logging_steps=10)
        t.args.save_strategy = "no"
        swapper.handler = t.callback_handler
        t.train()
        times = {k: list(v) for k, v in swapper.times.items()}
        # The run is over but ``ours`` keeps its monitor for this: reopen a live one.
        _ARGS[:] = [t.args]
        _CONTROL[:] = [t.control]
        t.state.global_step = 0
        ours.on_train_begin(t.args, t.state, t.control)
        cost = _dispatch_cost(
            t.callback_handler, ours, TrainerCallback(), swapper, t.state,
            2000 if quick else 20000,
        )  # fmt: skip
        ours.on_train_end(t.args, t.state, t.control)
    n = min(len(times["none"]), len(times["ckptdash"]))
    with_cb, without = times["ckptdash"][:n], times["none"][:n]
    ratio = paired(with_cb, without)
    low, high = paired_interval(with_cb, without)
    ms = 1e3 / ROUND
    step_s = median(without) / ROUND
    bare, with_ours = cost["none"], cost["ckptdash"]
    added, any_callback = with_ours - bare, cost["empty"] - bare
    direct = (step_s + added) / step_s
    return [
        Row(
            f"HF Trainer step, tiny BERT ({n} pairs of {ROUND}-step rounds in one train())",
            f"{median(with_cb) * ms:.2f} ms/step ({spread(with_cb)})",
            f"{median(without) * ms:.2f} ms/step without ({spread(without)})",
            ratio,
            f"≤ {GOAL}× (95% CI {low:.4f}–{high:.4f})",
            ratio <= GOAL,
        ),
        Row(
            "HF Trainer: ckptdash's callback per step, dispatched by the Trainer (direct)",
            f"+{added * 1e6:.2f} µs/step ({with_ours * 1e6:.2f} µs for the 4 events)",
            f"{bare * 1e6:.2f} µs without (an empty TrainerCallback: +{any_callback * 1e6:.2f}"
            f" µs); step {step_s * 1e3:.2f} ms",
            direct,
            f"≤ {GOAL}×",
            direct <= GOAL,
        ),
    ]


if __name__ == "__main__":
    from timing import table

    print(table(run(quick="--quick" in sys.argv)))
