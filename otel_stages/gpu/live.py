"""``otel-stages gpu``: what the sampler sees, per device, refreshed every interval.

Runs the same :class:`~otel_stages.gpu.sampler.Sampler` the service runs (no OpenTelemetry SDK,
nothing exported) so a host can be checked before the report's GPU verdicts are trusted: is
there a utilization ring, how often does the driver sample, which clock do its timestamps use,
which readings are not supported.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import IO, Any

from otel_stages import semconv
from otel_stages.gpu.backend import GpuBackend
from otel_stages.gpu.metrics import GPU_SM_ACTIVITY
from otel_stages.gpu.sampler import Sampler
from otel_stages.gpu.store import PendingPoint

GIB = 1024**3


def snapshot(sampler: Sampler, points: list[PendingPoint]) -> list[dict[str, Any]]:
    """One JSON-ready row per device from the points of the last refresh.

    Keys: ``uuid``, ``model``, ``mig``, ``utilization`` (mean of the refresh's samples, 0..1, or
    ``None`` when there were none / not supported), ``utilization_samples``, ``utilization_source``
    (``ring`` / ``instant`` / ``not_supported``), ``sample_period_ms`` (driver ring period),
    ``clock_domain``, ``memory_used_bytes``, ``memory_total_bytes``, ``power_w``,
    ``temperature_c``, ``sm_activity`` (latest values, ``None`` when not supported).
    """
    by_series: dict[tuple[str, str], list[float]] = defaultdict(list)
    for p in points:
        by_series[(p.uuid, p.metric)].append(p.point.value)
    stats = {d["uuid"]: d for d in sampler.stats()["devices"]}

    def latest(uuid: str, metric: str) -> float | None:
        values = by_series.get((uuid, metric))
        return values[-1] if values else None

    rows = []
    for device in sampler.devices:
        util = by_series.get((device.uuid, semconv.HW_GPU_UTILIZATION), [])
        info = stats.get(device.uuid, {})
        rows.append({
            "uuid": device.uuid, "model": device.name, "mig": device.is_mig,
            "utilization": round(statistics.fmean(util), 4) if util else None,
            "utilization_samples": len(util),
            "utilization_source": info.get("utilization"),
            "sample_period_ms": info.get("sample_period_ms"),
            "clock_domain": info.get("clock_domain"),
            "memory_used_bytes": latest(device.uuid, semconv.HW_GPU_MEMORY_USAGE),
            "memory_total_bytes": latest(device.uuid, semconv.HW_GPU_MEMORY_LIMIT),
            "power_w": latest(device.uuid, semconv.HW_POWER),
            "temperature_c": latest(device.uuid, semconv.HW_TEMPERATURE),
            "sm_activity": latest(device.uuid, GPU_SM_ACTIVITY),
        })
    return rows


def _fmt(value: float | None, pattern: str, missing: str = "n/a") -> str:
    return missing if value is None else pattern.format(value)


def render(rows: list[dict[str, Any]], interval_s: float) -> str:
    """Human-readable block for :func:`snapshot` rows."""
    lines = []
    for r in rows:
        lines.append(f"{r['uuid']}  {r['model']}{'  (MIG instance)' if r['mig'] else ''}")
        source = r["utilization_source"]
        if source == "ring":
            period = _fmt(r["sample_period_ms"], "{:.1f} ms", "?")
            how = f"driver ring sampled every {period}, {r['clock_domain']} clock"
        elif source == "instant":
            how = f"instant readings every {interval_s:g} s (no sample ring)"
        else:
            how = "not supported on this device"
        util = _fmt(r["utilization"], "{:6.1%}", "   n/a")
        lines.append(f"  utilization {util}  ({r['utilization_samples']} samples; {how})")
        used, total = r["memory_used_bytes"], r["memory_total_bytes"]
        limit = _fmt(total and total / GIB, '{:.1f}', '?')
        memory = "n/a" if used is None else f"{used / GIB:.1f} / {limit} GiB"
        lines.append(f"  memory      {memory}   power {_fmt(r['power_w'], '{:.0f} W')}   "
                     f"temperature {_fmt(r['temperature_c'], '{:.0f} C')}   "
                     f"SM activity {_fmt(r['sm_activity'], '{:.0%}')}")
    return "\n".join(lines)


def run(backend: GpuBackend, *, interval_s: float = 1.0, count: int | None = None,
        as_json: bool = False, out: IO[str], err: IO[str],
        sleep: Callable[[float], None] = time.sleep) -> int:
    """Show ``count`` refreshes (``None``: until interrupted); the first right after init.

    Returns 0, or 1 when NVML is unavailable or lists no GPU (reason on ``err``).
    """
    sampler = Sampler(backend, interval_s=interval_s)
    sampler.log_unavailable = False
    if not sampler.open():
        err.write(f"otel-stages gpu: NVML unavailable: {sampler.reason}\n")
        return 1
    try:
        shown = 0
        while count is None or shown < count:
            if shown:
                sleep(interval_s)  # the refresh period of a live view, not a wait for data
            sampler.run_once()
            rows = snapshot(sampler, sampler.store.drain())
            if as_json:
                out.write(json.dumps({"time_unix": round(time.time(), 3), "interval_s": interval_s,
                                      "init_s": sampler.init_s, "devices": rows}) + "\n")
            else:
                out.write(f"--- {time.strftime('%H:%M:%S')}  (every {interval_s:g} s)\n")
                out.write(render(rows, interval_s) + "\n")
            out.flush()
            shown += 1
    finally:
        sampler.stop()
    return 0
