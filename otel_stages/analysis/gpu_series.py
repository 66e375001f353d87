"""GPU samples for the HTML report's time axis: ``hw.gpu.utilization`` / ``hw.gpu.memory.*`` points
near the requests, per process and GPU, in seconds from the first request (plain data for
:mod:`otel_stages.analysis.charts`)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from otel_stages import semconv
from otel_stages.analysis.gpu_owners import (
    is_guessed,
    is_model_utilization,
    point_processes,
    sender_divisors,
)
from otel_stages.analysis.model import MetricPoint


@dataclass(frozen=True)
class GpuSeries:
    """One GPU (``hw.id``; ``model`` = ``hw.model``) of one process (``process``:
    :func:`~otel_stages.analysis.requests.process_key` of the points' resource; ``hw.id`` is unique
    only within a host, :mod:`otel_stages.analysis.gpu_owners`): ``utilization`` as
    ``(t_s, 0..1)`` and ``memory_used_bytes`` as ``(t_s, bytes)`` samples in time order;
    ``memory_limit_bytes`` the largest ``hw.gpu.memory.limit`` seen (``None`` without)."""

    hw_id: str
    model: str | None
    utilization: tuple[tuple[float, float], ...]
    memory_used_bytes: tuple[tuple[float, float], ...]
    memory_limit_bytes: float | None
    process: str = ""


def gpu_series(points: Sequence[MetricPoint], origin_ns: int, lo_ns: int, hi_ns: int
               ) -> tuple[GpuSeries, ...]:
    """One :class:`GpuSeries` per process and ``hw.id`` from the points taken in ``[lo_ns, hi_ns]`` (Unix
    ns), times in seconds from ``origin_ns``; utilization given in percent is scaled to 0..1, and
    the undeclared points of an ambiguous sender
    (:func:`~otel_stages.analysis.gpu_owners.is_ambiguous`: undeclared unit, only 0 and 1) are not
    drawn, as the verdict leaves them out (a near-idle GPU would show 100 %); the unit is guessed
    per sender and unit on all its points (:func:`~otel_stages.analysis.gpu_owners.sender_divisors`), as
    the verdict guesses it."""
    util: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    used: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    limit: dict[tuple[str, str], float] = {}
    model: dict[tuple[str, str], str] = {}
    divisors = sender_divisors(points)  # judged on all its points, as the verdict
    near = [p for p in points if lo_ns <= p.time_ns <= hi_ns]
    for p, proc in zip(near, point_processes(near)):
        hw_id = proc, str(p.attributes.get(semconv.HW_ID, ""))
        if is_model_utilization(p):
            divide = divisors[proc, p.unit] if is_guessed(p.unit) else 1.0
            if divide is None:
                continue
            util[hw_id].append((p.time_ns, p.value / divide))
        elif p.name == semconv.HW_GPU_MEMORY_USAGE:
            used[hw_id].append((p.time_ns, p.value))
        elif p.name == semconv.HW_GPU_MEMORY_LIMIT:
            limit[hw_id] = max(limit.get(hw_id, 0.0), p.value)
        else:
            continue
        name = p.attributes.get(semconv.HW_MODEL)
        if isinstance(name, str) and name:
            model[hw_id] = name
    out = []
    for hw_id in sorted(set(util) | set(used)):
        samples = sorted(util.get(hw_id, []))
        out.append(GpuSeries(
            hw_id=hw_id[1],
            model=model.get(hw_id),
            utilization=tuple(((t - origin_ns) / 1e9, v) for t, v in samples),
            memory_used_bytes=tuple(((t - origin_ns) / 1e9, v) for t, v in sorted(used.get(hw_id, []))),
            memory_limit_bytes=limit.get(hw_id),
            process=hw_id[0],
        ))
    return tuple(out)
