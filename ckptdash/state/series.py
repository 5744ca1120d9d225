"""The thinned progress series of :class:`~ckptdash.state.RunState`: per attempt, at most
:data:`SERIES_POINTS` (t, step) points, whatever the length of the run.

Plain data on the state's hot path (every rank-0 heartbeat and pulse may land here): no
Panel, no files, only msgspec.
"""

from __future__ import annotations

from typing import Final

import msgspec

SERIES_POINTS: Final = 2048
"""Most points kept per attempt in the progress series.

A point is the earliest rank-0 heartbeat in its time bucket; buckets start at
1 s and double in width whenever an attempt would hold more points than this.
The result depends only on the set of heartbeats, not on their order. The kept
heartbeats' metrics are the metrics plot's points (:meth:`RunState.metrics`).
"""

NO_METRICS: Final = msgspec.Raw(b"{}")
"""The metrics of a point that has none (a pulse)."""


class Series:
    """Earliest (t, step) per time bucket, with its heartbeat's metrics; the bucket width
    doubles to stay under a cap. The metrics are copied: a heartbeat read from a file is a view
    into the whole buffer it was decoded from, which would stay in memory with it.

    The caller skips :meth:`add` when ``lo <= t < hi and t > min_t`` (a heartbeat later than
    its bucket's minimum changes nothing): that test is the hot path's, kept out of a call.
    """

    __slots__ = ("buckets", "hi", "lo", "min_t", "width")

    def __init__(self) -> None:
        self.width = 1.0
        self.buckets: dict[float, tuple[float, int, msgspec.Raw]] = {}
        # The bucket the last point fell in: a heartbeat later than its minimum changes nothing.
        self.lo = self.hi = self.min_t = 0.0

    def add(self, t: float, step: int | None, metrics: msgspec.Raw) -> None:
        if step is None:
            return
        b = t // self.width
        old = self.buckets.get(b)
        if (
            old is None
            or (t, step) < old[:2]
            or ((t, step) == old[:2] and bytes(metrics) > bytes(old[2]))  # order-independent
        ):
            self.buckets[b] = (t, step, metrics.copy())
            while len(self.buckets) > SERIES_POINTS:
                self.width *= 2  # powers of two: bucket floor(t/2w) is the union of two old ones
                merged: dict[float, tuple[float, int, msgspec.Raw]] = {}
                for point in self.buckets.values():
                    nb = point[0] // self.width
                    if nb not in merged or point[:2] < merged[nb][:2]:
                        merged[nb] = point
                self.buckets = merged
            b = t // self.width
        self.lo, self.hi = b * self.width, (b + 1) * self.width
        self.min_t = self.buckets[b][0]

    def points(self) -> list[tuple[float, int]]:
        return sorted(p[:2] for p in self.buckets.values())

    def heartbeats(self) -> list[tuple[float, int, msgspec.Raw]]:
        return sorted(self.buckets.values(), key=lambda p: p[:2])
