"""The metrics plot's points, decoded when a view first reads them.

A run's kept heartbeats (:mod:`ckptdash.state.series`) carry their metrics as raw JSON.
Decoded, they are several times larger; a dashboard over a folder of 1,000 runs shows
the metrics of one, so :class:`MetricPoints` keeps the raw heartbeats and decodes them on
the first read. :class:`MetricDecoder` remembers what it decoded for a run, so that the
next snapshot of the same run decodes only its new points.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence

import msgspec

from ckptdash import events as ev_
from ckptdash.state.records import MetricPoint

Heartbeats = Mapping[int, Sequence[tuple[float, int, msgspec.Raw]]]
"""Per attempt, the kept heartbeats (t, step, raw metrics), by time."""


class MetricDecoder:
    """Decodes kept heartbeats into :class:`MetricPoint` objects, once each.

    Thread-safe: the views of several sessions may read one snapshot at the same moment.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._decoded: dict[int, tuple[msgspec.Raw, MetricPoint]] = {}

    def decode(self, heartbeats: Heartbeats) -> dict[int, list[MetricPoint]]:
        """Per attempt, the points of ``heartbeats``; forgets points no longer kept."""
        out: dict[int, list[MetricPoint]] = {}
        with self._lock:
            cache, fresh = self._decoded, {}
            for n in sorted(heartbeats):
                points = []
                for t, step, raw in heartbeats[n]:
                    hit = cache.get(id(raw))
                    if hit is None or hit[0] is not raw:  # an id can be reused: check identity
                        hit = (raw, MetricPoint(step, t, n, ev_.decode_metrics(raw)))
                    fresh[id(raw)] = hit
                    points.append(hit[1])
                if points:
                    out[n] = points
            self._decoded = fresh
        return out


class MetricPoints(Mapping[int, Sequence[MetricPoint]]):
    """Per attempt, the metrics of the kept heartbeats, by time; decoded on the first read."""

    __slots__ = ("_decoder", "_heartbeats", "_lock", "_points")

    def __init__(self, heartbeats: Heartbeats, decoder: MetricDecoder | None = None) -> None:
        self._heartbeats = heartbeats
        self._decoder = MetricDecoder() if decoder is None else decoder
        self._lock = threading.Lock()
        self._points: dict[int, list[MetricPoint]] | None = None

    def _decoded(self) -> dict[int, list[MetricPoint]]:
        points = self._points
        if points is None:
            with self._lock:
                if self._points is None:
                    self._points = self._decoder.decode(self._heartbeats)
                points = self._points
        return points

    def __getitem__(self, attempt: int) -> Sequence[MetricPoint]:
        return self._decoded()[attempt]

    def __iter__(self) -> Iterator[int]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())

    def __repr__(self) -> str:
        state = "decoded" if self._points is not None else "not decoded yet"
        return f"MetricPoints({len(self._heartbeats)} attempts, {state})"
