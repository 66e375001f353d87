"""Per-request signal amounts for one stage, read from span attributes, span events and metric
points (what :mod:`otel_stages.signals` records; any producer writing the same names works).

For each warm request and stage, :func:`stage_samples` gives a :class:`Sample`: the stage's ms
(as in the statistics: the part inside the request span) and, where known, how much of it was

* ``cpu_ms``: the thread's CPU time (``thread.cpu_time_ms``, summed over the stage's spans); the
  rest, ``wall - cpu``, is time the thread was not running (``wait_ms``);
* ``gc_ms``: garbage-collector time while the stage was open (``otel_stages.gc.pause_ms``, else
  the overlap of ``cpython.gc.pause`` events with the span);
* ``lag_ms``: asyncio event-loop lag while the stage waited on the loop
  (``otel_stages.event_loop.lag_ms``);
* ``throttled_ms``: time the cgroup was throttled while the stage ran, interpolated from the
  cumulative ``container.cpu.throttling_data.throttled_time`` points of the request's process.

A span that carries ``thread.cpu_time_ms`` was recorded with signals on, so a missing GC or lag
attribute on it means none (0), not unknown. :func:`holders` lists the stage spans that held an
event loop (``otel_stages.event_loop.held_ms``).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from otel_stages import semconv
from otel_stages.analysis.model import MetricPoint, Span
from otel_stages.analysis.requests import Request, process_key


@dataclass(frozen=True)
class Sample:
    """One warm request's stage: ``wall_ms`` and the parts above (``None`` = not recorded)."""

    wall_ms: float
    cpu_ms: float | None = None
    gc_ms: float | None = None
    lag_ms: float | None = None
    throttled_ms: float | None = None

    @property
    def wait_ms(self) -> float | None:
        """``wall - cpu``, not below 0; ``None`` without CPU time."""
        return None if self.cpu_ms is None else max(0.0, self.wall_ms - self.cpu_ms)

    @property
    def cpu_utilization(self) -> float | None:
        """``cpu / wall`` (0..1); ``None`` without CPU time or for an empty stage."""
        if self.cpu_ms is None or self.wall_ms <= 0:
            return None
        return min(1.0, self.cpu_ms / self.wall_ms)


def _number(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


class ThrottleSeries:
    """Cumulative throttled time per process (``process_key`` of the points' resource), for
    :meth:`throttled_ms` over a window. Points out of order are sorted; a counter that goes down
    (a new cgroup, a restart) ends the usable range at the drop."""

    def __init__(self, points: Sequence[MetricPoint]) -> None:
        raw: dict[str, list[tuple[int, float]]] = defaultdict(list)
        for p in points:
            if p.name == semconv.CONTAINER_CPU_THROTTLED_TIME:
                raw[process_key(p.resource)].append((p.time_ns, p.value))
        self._series: dict[str, tuple[list[int], list[float]]] = {}
        for key, pts in raw.items():
            pts.sort()
            kept = pts[:1]
            for t, v in pts[1:]:
                if v < kept[-1][1]:
                    break
                kept.append((t, v))
            self._series[key] = ([t for t, _ in kept], [v for _, v in kept])
        limits: dict[str, list[float]] = defaultdict(list)
        for p in points:
            if p.name == semconv.CONTAINER_CPU_LIMIT:
                limits[process_key(p.resource)].append(p.value)
        #: CPU quota (cpus) per process, the latest value seen
        self.limits = {k: v[-1] for k, v in limits.items()}

    def __bool__(self) -> bool:
        return bool(self._series)

    def _at(self, key: str, t_ns: int) -> float | None:
        series = self._series.get(key)
        if series is None:
            return None
        times, values = series
        if not times or t_ns < times[0] or t_ns > times[-1]:
            return None
        i = bisect.bisect_left(times, t_ns)
        if times[i] == t_ns or i == 0:
            return values[i]
        t0, t1, v0, v1 = times[i - 1], times[i], values[i - 1], values[i]
        return v0 + (v1 - v0) * (t_ns - t0) / (t1 - t0)

    def throttled_ms(self, key: str, start_ns: int, end_ns: int) -> float | None:
        """Throttled ms between two times of process ``key``; ``None`` when not covered."""
        a, b = self._at(key, start_ns), self._at(key, end_ns)
        if a is None or b is None:
            return None
        return max(0.0, (b - a) / 1e6)


def _gc_from_events(span: Span) -> float:
    total = 0
    for event in span.events:
        if event.name != semconv.EVENT_GC_PAUSE:
            continue
        duration = _number(event.attributes.get(semconv.GC_DURATION_MS))
        if duration is None:
            continue
        end = event.time_ns + int(duration * 1e6)
        total += max(0, min(end, span.end_ns) - max(event.time_ns, span.start_ns))
    return total / 1e6


def _sample(req: Request, spans: list[Span], throttle: ThrottleSeries, stage: str) -> Sample:
    cpu: float | None = 0.0
    gc: float | None = 0.0
    lag: float | None = 0.0
    throttled: float | None = 0.0 if throttle else None
    key = process_key(req.resource)
    for span in spans:
        attrs = span.attributes
        span_cpu = _number(attrs.get(semconv.THREAD_CPU_TIME_MS))
        recorded = span_cpu is not None
        cpu = None if cpu is None or span_cpu is None else cpu + span_cpu
        span_gc = _number(attrs.get(semconv.GC_PAUSE_MS))
        if span_gc is None and any(e.name == semconv.EVENT_GC_PAUSE for e in span.events):
            span_gc = _gc_from_events(span)
        if span_gc is None and recorded:
            span_gc = 0.0
        gc = None if gc is None or span_gc is None else gc + span_gc
        span_lag = _number(attrs.get(semconv.EVENT_LOOP_LAG_MS))
        if span_lag is None and recorded:
            span_lag = 0.0
        lag = None if lag is None or span_lag is None else lag + span_lag
        if throttled is not None:
            part = throttle.throttled_ms(key, span.start_ns, span.end_ns)
            throttled = None if part is None else throttled + part
    return Sample(req.stages_ms[stage], cpu, gc, lag, throttled)


def stage_samples(warm: Sequence[Request], stage: str, throttle: ThrottleSeries) -> list[Sample]:
    """One :class:`Sample` per warm request in which ``stage`` ran (request order)."""
    out = []
    for req in warm:
        if stage not in req.stages_ms:
            continue
        spans = [s for s in req.spans if s.name == stage]
        if spans:
            out.append(_sample(req, spans, throttle, stage))
    return out


def holders(requests: Sequence[Request]) -> dict[str, list[float]]:
    """Stage name -> ms of each of its spans that held an event loop, over ``requests``."""
    out: dict[str, list[float]] = defaultdict(list)
    for req in requests:
        for span in req.spans:
            held = _number(span.attributes.get(semconv.EVENT_LOOP_HELD_MS))
            if held is not None and held > 0:
                out[span.name].append(held)
    return dict(out)
