"""The small shared part of the benchmarks: interleaved repetitions, medians, table rows.

Every figure is compared with its baseline *in the same run*: the variants of one
benchmark take turns (the order rotates each repetition, so neither always runs
first or second), and the table shows medians.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    """One line of the results table; ``ratio`` is the ckptdash figure ÷ the baseline's.

    Where both were repeated, the ratio is the median of the per-repetition ratios
    (see :func:`paired`), so it can differ slightly from the ratio of the two medians.
    """

    metric: str
    ckptdash: str
    baseline: str
    ratio: float | None
    goal: str = ""
    met: bool | None = None  # None: no goal, the row is for information


def interleave(variants: Mapping[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Call each variant ``reps`` times, taking turns in a rotating order.

    A variant returns the figure it measured (usually seconds, setup excluded).
    """
    names = list(variants)
    out: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        shift = rep % len(names)
        for name in names[shift:] + names[:shift]:
            out[name].append(variants[name]())
    return out


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def paired(a: list[float], b: list[float]) -> float:
    """Median over repetitions of a[i] / b[i]: each pair ran side by side, so drift cancels."""
    return median([x / y for x, y in zip(a, b, strict=True)])


def paired_interval(a: list[float], b: list[float], draws: int = 2000) -> tuple[float, float]:
    """A 95 % bootstrap interval of :func:`paired`: how far its median could be off by chance.

    Resamples the per-repetition ratios (a fixed seed: the same data gives the same interval).
    """
    ratios = [x / y for x, y in zip(a, b, strict=True)]
    rng = random.Random(0)
    medians = sorted(median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def spread(values: list[float]) -> str:
    """How noisy a figure was: half the interquartile range (8+ samples) or the full range."""
    mid = median(values)
    if not mid or len(values) < 2:
        return "n/a"
    if len(values) >= 8:
        q1, _, q3 = statistics.quantiles(values, n=4)
        return f"IQR ±{(q3 - q1) / 2 / mid * 100:.1f}%"
    return f"range ±{(max(values) - min(values)) / 2 / mid * 100:.1f}%"


def table(rows: list[Row]) -> str:
    """The rows as one markdown table."""
    lines = [
        "| metric | ckptdash | baseline | ratio | goal |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = "—" if r.ratio is None else f"{r.ratio:.{4 if 0.99 < r.ratio < 1.01 else 3}f}×"
        mark = {True: " ✅", False: " ❌", None: ""}[r.met]
        lines.append(
            f"| {r.metric} | {r.ckptdash} | {r.baseline} | {ratio} | {r.goal or '—'}{mark} |"
        )
    return "\n".join(lines)
