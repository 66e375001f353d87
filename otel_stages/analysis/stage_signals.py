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
  cumulative ``container.cpu.throttling_data.throttled_time`` points of the request's process;
* ``pressure_ms``: CPU pressure stall time (Linux PSI ``some``: at least one task of the
  process's cgroup, else of the host, was runnable but waiting for a core) while the stage ran,
  interpolated likewise from the cumulative ``system.cpu.linux.pressure.total`` points
  (``stall_type`` ``some``, seconds) of the request's process;
* ``runq_ms``: the stage thread's run-queue wait (``otel_stages.thread.run_queue_wait_ms``,
  Linux schedstat ``run_delay``: runnable, waiting for a core), summed like the CPU time; opt-in
  at the producer, so unknown (not 0) on a span without it. ``wall - cpu - runq`` is the time
  the thread was blocked (``blocked_ms``: I/O, a lock, a sleep, the GIL).

A span that carries ``thread.cpu_time_ms`` was recorded with signals on, so a missing GC or lag
attribute on it means none (0), not unknown. :func:`holders` lists the stage spans that held an
event loop (``otel_stages.event_loop.held_ms``).
"""

from __future__ import annotations

import bisect
from array import array
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from otel_stages import semconv
from otel_stages.analysis.columns import Flags, Floats
from otel_stages.analysis.model import MetricPoint, Span
from otel_stages.analysis.requests import Request, process_key, usable_float


@dataclass(frozen=True)
class Sample:
    """One warm request's stage: ``wall_ms`` and the parts above (``None`` = not recorded)."""

    wall_ms: float
    cpu_ms: float | None = None
    gc_ms: float | None = None
    lag_ms: float | None = None
    throttled_ms: float | None = None
    pressure_ms: float | None = None
    runq_ms: float | None = None

    @property
    def blocked_ms(self) -> float | None:
        """``wall - cpu - runq``, not below 0; ``None`` without CPU time or run-queue wait."""
        if self.cpu_ms is None or self.runq_ms is None:
            return None
        return max(0.0, self.wall_ms - self.cpu_ms - self.runq_ms)

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
    # numbers written as text too, as the ClickHouse SQL reads the exporter's text
    # (requests.usable_float)
    return usable_float(value)


class CounterSeries:
    """One cumulative counter per process (``process_key`` of the points' resource), for
    :meth:`rise_ms` over a window: the points named ``name`` (with ``attributes`` among their
    point attributes), values times ``ms_per_unit``. Points out of order are sorted; a counter
    that goes down (a new cgroup, a restart) ends the usable range at the drop."""

    def __init__(self, points: Sequence[MetricPoint], name: str, ms_per_unit: float,
                 attributes: dict[str, str] | None = None) -> None:
        raw: dict[str, list[tuple[int, float]]] = defaultdict(list)
        want = tuple((attributes or {}).items())
        for p in points:
            if p.name == name and all(p.attributes.get(k) == v for k, v in want):
                raw[process_key(p.resource)].append((p.time_ns, p.value))
        self._ms_per_unit = ms_per_unit
        self._series: dict[str, tuple[list[int], list[float]]] = {}
        for key, pts in raw.items():
            pts.sort()
            kept = pts[:1]
            for t, v in pts[1:]:
                if v < kept[-1][1]:
                    break
                kept.append((t, v))
            self._series[key] = ([t for t, _ in kept], [v for _, v in kept])

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

    def rise_ms(self, key: str, start_ns: int, end_ns: int) -> float | None:
        """The counter's rise (ms) between two times of process ``key``; ``None`` when not
        covered."""
        a, b = self._at(key, start_ns), self._at(key, end_ns)
        if a is None or b is None:
            return None
        return max(0.0, (b - a) * self._ms_per_unit)


class ThrottleSeries(CounterSeries):
    """Cumulative throttled time (``container.cpu.throttling_data.throttled_time``, ns) per
    process (:class:`CounterSeries`), and ``limits``: the CPU quota (cpus) per process, the
    latest ``container.cpu.limit`` seen."""

    def __init__(self, points: Sequence[MetricPoint]) -> None:
        super().__init__(points, semconv.CONTAINER_CPU_THROTTLED_TIME, 1e-6)
        limits: dict[str, list[float]] = defaultdict(list)
        for p in points:
            if p.name == semconv.CONTAINER_CPU_LIMIT:
                limits[process_key(p.resource)].append(p.value)
        #: CPU quota (cpus) per process, the latest value seen
        self.limits = {k: v[-1] for k, v in limits.items()}

    def throttled_ms(self, key: str, start_ns: int, end_ns: int) -> float | None:
        """Throttled ms between two times of process ``key``; ``None`` when not covered."""
        return self.rise_ms(key, start_ns, end_ns)


class PressureSeries(CounterSeries):
    """Cumulative CPU pressure stall time (``system.cpu.linux.pressure.total`` with
    ``system.linux.pressure.stall_type`` = ``some``, seconds) per process
    (:class:`CounterSeries`); :meth:`pressure_ms` over a window. ``scope``: ``cgroup`` when every
    such point says it was read from the process's cgroup (``otel_stages.pressure.scope``), else
    ``host`` (points without the attribute, older files and other producers, count as host);
    ``None`` without points."""

    def __init__(self, points: Sequence[MetricPoint]) -> None:
        super().__init__(points, semconv.SYSTEM_CPU_PRESSURE_TOTAL, 1e3,
                         {semconv.SYSTEM_LINUX_PRESSURE_STALL_TYPE: semconv.PRESSURE_STALL_SOME})
        self.scope = pressure_scope(points)

    def pressure_ms(self, key: str, start_ns: int, end_ns: int) -> float | None:
        """CPU pressure ms between two times of process ``key``; ``None`` when not covered."""
        return self.rise_ms(key, start_ns, end_ns)


def pressure_scope(points: Sequence[MetricPoint]) -> str | None:
    """What :attr:`PressureSeries.scope` says, from the metric points."""
    scopes = {p.attributes.get(semconv.PRESSURE_SCOPE) for p in points
              if p.name == semconv.SYSTEM_CPU_PRESSURE_TOTAL
              and p.attributes.get(semconv.SYSTEM_LINUX_PRESSURE_STALL_TYPE)
              == semconv.PRESSURE_STALL_SOME}
    if not scopes:
        return None
    return (semconv.PRESSURE_SCOPE_CGROUP if scopes == {semconv.PRESSURE_SCOPE_CGROUP}
            else semconv.PRESSURE_SCOPE_HOST)


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


@dataclass(frozen=True)
class StageColumns:
    """One stage's :class:`Sample` values over the requests it ran in, as numpy columns in request
    order: ``rows`` (each request's position in the :class:`SignalTable`'s request list),
    ``wall_ms``, and per part its values (0 where not recorded) with a mask of where it was
    recorded (``*_known``)."""

    rows: npt.NDArray[np.int64]
    wall_ms: Floats
    cpu_ms: Floats
    cpu_known: Flags
    gc_ms: Floats
    gc_known: Flags
    lag_ms: Floats
    lag_known: Flags
    throttled_ms: Floats
    throttled_known: Flags
    pressure_ms: Floats
    pressure_known: Flags
    runq_ms: Floats
    runq_known: Flags

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, keep: Flags) -> StageColumns:
        """The samples where ``keep`` (one flag per sample) is true, ``rows`` unchanged."""
        return StageColumns(*(column[keep] for column in _fields_of(self)))

    def samples(self) -> list[Sample]:
        """As :class:`Sample` records (``None`` where a part is not recorded)."""
        def known(values: Floats, flags: Flags) -> list[float | None]:
            return [v if k else None for v, k in zip(values.tolist(), flags.tolist())]
        return [Sample(*row) for row in zip(
            self.wall_ms.tolist(), known(self.cpu_ms, self.cpu_known),
            known(self.gc_ms, self.gc_known), known(self.lag_ms, self.lag_known),
            known(self.throttled_ms, self.throttled_known),
            known(self.pressure_ms, self.pressure_known), known(self.runq_ms, self.runq_known))]


def _fields_of(columns: StageColumns) -> tuple[Any, ...]:
    """The fields of ``columns`` in order (``dataclasses.astuple`` would copy every array)."""
    return tuple(getattr(columns, f.name) for f in fields(columns))


@dataclass(frozen=True)
class SignalTable:
    """Per-request signal amounts of a list of warm requests, read once (a fleet's recording has
    hundreds of thousands; the diagnosis asks again for each input cohort, a subset).

    ``requests``: how many requests; ``stages``: stage name -> :class:`StageColumns`;
    ``held``: ``(row, span name, ms)`` of every span that held an event loop, in request and
    span order (:func:`holders`); ``pressure_scope``: the CPU pressure's
    (:attr:`PressureSeries.scope`)."""

    requests: int
    stages: dict[str, StageColumns]
    held: tuple[tuple[int, str, float], ...] = ()
    pressure_scope: str | None = None

    def subset(self, rows: Sequence[int]) -> SignalTable:
        """The table of the requests at positions ``rows`` (ascending) of this one's list,
        renumbered ``0..len(rows) - 1``: what :func:`signal_table` gives for those requests."""
        index = np.full(self.requests, -1, dtype=np.int64)
        index[np.asarray(rows, dtype=np.int64)] = np.arange(len(rows), dtype=np.int64)
        stages = {}
        for name, columns in self.stages.items():
            new = index[columns.rows]
            keep = new >= 0
            taken = columns.take(keep)
            stages[name] = replace(taken, rows=new[keep])
        held = tuple((int(index[row]), name, ms) for row, name, ms in self.held if index[row] >= 0)
        return SignalTable(len(rows), stages, held, self.pressure_scope)

    def holders(self) -> dict[str, list[float]]:
        """:func:`holders` of the table's requests."""
        out: dict[str, list[float]] = defaultdict(list)
        for _, name, ms in self.held:
            out[name].append(ms)
        return dict(out)


def signal_table(warm: Sequence[Request], stages: Sequence[str] | None,
                 throttle: ThrottleSeries, pressure: PressureSeries | None = None) -> SignalTable:
    """The :class:`SignalTable` of ``warm`` for ``stages`` (``None``: every stage that ran): one
    pass over the requests' spans. Per request and stage the parts are summed over the stage's
    spans in span order; a part missing on one of them is not recorded for the request (module
    docstring). ``pressure``: the CPU pressure series (``None``: not recorded)."""
    wanted = None if stages is None else frozenset(stages)
    series = throttle if throttle else None
    psi = pressure if pressure else None
    # per stage: rows; wall, cpu, gc, lag, throttled, pressure, runq (0 where not recorded); the
    # six known flags.
    # array.array, not lists: 8 bytes a value while building (a fleet's five stages of hundreds
    # of thousands of requests would otherwise hold a float object per value)
    columns: dict[str, tuple[array[int], array[float], array[int]]] = {}
    held: list[tuple[int, str, float]] = []
    keys: dict[int, str] = {}
    for row, req in enumerate(warm):  # runs once per request of a fleet: lookups hoisted
        ran = req.stages_ms
        key = ""
        if series is not None or psi is not None:
            key = keys.get(id(req.resource), "")
            if not key:
                key = keys[id(req.resource)] = process_key(req.resource)
        sums: dict[str, tuple[float | None, float | None, float | None, float | None,
                              float | None, float | None]] = {}
        for span in req.spans:
            attrs = span.attributes
            name = span.name
            if attrs:
                mark = attrs.get(semconv.EVENT_LOOP_HELD_MS)
                if mark is not None:
                    ms = _number(mark)
                    if ms is not None and ms > 0:
                        held.append((row, name, ms))
            if name not in ran or (wanted is not None and name not in wanted):
                continue
            span_cpu = attrs.get(semconv.THREAD_CPU_TIME_MS)
            if span_cpu is not None and type(span_cpu) is not float:
                span_cpu = _number(span_cpu)
            recorded = span_cpu is not None
            span_runq = attrs.get(semconv.THREAD_RUN_QUEUE_WAIT_MS)
            if span_runq is not None and type(span_runq) is not float:
                span_runq = _number(span_runq)
            span_gc = attrs.get(semconv.GC_PAUSE_MS)
            if type(span_gc) is not float:  # absent (the usual case: no collection) or odd
                span_gc = None if span_gc is None else _number(span_gc)
                if span_gc is None and span.events and any(
                        e.name == semconv.EVENT_GC_PAUSE for e in span.events):
                    span_gc = _gc_from_events(span)
                if span_gc is None and recorded:
                    span_gc = 0.0
            span_lag = attrs.get(semconv.EVENT_LOOP_LAG_MS)
            if type(span_lag) is not float:
                span_lag = None if span_lag is None else _number(span_lag)
                if span_lag is None and recorded:
                    span_lag = 0.0
            # each sum starts at 0.0 (0.0 + -0.0 is 0.0); a part missing on one span is unknown
            cpu, gc, lag, throttled, stalled, runq = sums.get(name) or (
                0.0, 0.0, 0.0, 0.0 if series else None, 0.0 if psi else None, 0.0)
            if series is not None and throttled is not None:
                part = series.throttled_ms(key, span.start_ns, span.end_ns)
                throttled = None if part is None else throttled + part
            if psi is not None and stalled is not None:
                part = psi.pressure_ms(key, span.start_ns, span.end_ns)
                stalled = None if part is None else stalled + part
            sums[name] = (None if cpu is None or span_cpu is None else cpu + span_cpu,
                          None if gc is None or span_gc is None else gc + span_gc,
                          None if lag is None or span_lag is None else lag + span_lag,
                          throttled, stalled,
                          None if runq is None or span_runq is None else runq + span_runq)
        for name, (cpu, gc, lag, throttled, stalled, runq) in sums.items():
            col = columns.get(name)
            if col is None:
                col = columns[name] = (array("q"), array("d"), array("b"))
            col[0].append(row)
            col[1].extend((ran[name], 0.0 if cpu is None else cpu, 0.0 if gc is None else gc,
                           0.0 if lag is None else lag, 0.0 if throttled is None else throttled,
                           0.0 if stalled is None else stalled, 0.0 if runq is None else runq))
            col[2].extend((cpu is not None, gc is not None, lag is not None,
                           throttled is not None, stalled is not None, runq is not None))
    return SignalTable(len(warm), {name: _stage_columns(*col) for name, col in columns.items()},
                       tuple(held), None if psi is None else psi.scope)


def _stage_columns(rows: array[int], values: array[float], known: array[int]) -> StageColumns:
    """Columns from what :func:`signal_table` collected (``values``: 7 a sample, ``known``: 6)."""
    v = np.frombuffer(values, dtype=np.float64).reshape(-1, 7).T
    k = np.frombuffer(known, dtype=np.bool_).reshape(-1, 6).T
    return StageColumns(np.frombuffer(rows, dtype=np.int64).copy(), v[0].copy(),
                        v[1].copy(), k[0].copy(), v[2].copy(), k[1].copy(),
                        v[3].copy(), k[2].copy(), v[4].copy(), k[3].copy(),
                        v[5].copy(), k[4].copy(), v[6].copy(), k[5].copy())


def samples_by_stage(warm: Sequence[Request], stages: Sequence[str],
                     throttle: ThrottleSeries, pressure: PressureSeries | None = None
                     ) -> dict[str, list[Sample]]:
    """:func:`stage_samples` of each of ``stages`` at once: one pass over the requests' spans (a
    fleet's recording has hundreds of thousands of requests). Every stage is a key."""
    table = signal_table(warm, stages, throttle, pressure)
    return {stage: table.stages[stage].samples() if stage in table.stages else []
            for stage in stages}


def stage_samples(warm: Sequence[Request], stage: str, throttle: ThrottleSeries,
                  pressure: PressureSeries | None = None) -> list[Sample]:
    """One :class:`Sample` per warm request in which ``stage`` ran (request order)."""
    return samples_by_stage(warm, [stage], throttle, pressure)[stage]


def holders(requests: Sequence[Request]) -> dict[str, list[float]]:
    """Stage name -> ms of each of its spans that held an event loop, over ``requests``."""
    out: dict[str, list[float]] = defaultdict(list)
    for req in requests:
        for span in req.spans:
            held = _number(span.attributes.get(semconv.EVENT_LOOP_HELD_MS))
            if held is not None and held > 0:
                out[span.name].append(held)
    return dict(out)
