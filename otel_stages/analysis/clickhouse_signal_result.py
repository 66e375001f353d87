"""The answers of :mod:`otel_stages.analysis.clickhouse_signals` as the inputs of the one rule
set: :class:`~otel_stages.analysis.mechanisms.StageSignals` per stage (parts only; the rules add
the mechanisms), :class:`~otel_stages.analysis.mechanisms.Held` per stage, and the GPU memory rule's
:class:`~otel_stages.analysis.gpu_memory.MemoryEvidence`, over all warm requests and per cohort
(:class:`ScopeSignals`). Pure: no engine, no rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.gpu_memory import ForwardMemory, MemoryEvidence
from otel_stages.analysis.gpu_owners import hw_of
from otel_stages.analysis.signal_figures import Held, Part, StageSignals


def _f(v: Any) -> float | None:
    return None if v is None else float(v)


def part(row: Mapping[str, Any], p: str) -> Part | None:
    """One :class:`~otel_stages.analysis.mechanisms.Part` from a ``stage_signals_sql`` row
    (``None`` when the signal is known for no run)."""
    n = int(row[f"{p}_n"] or 0)
    if not n:
        return None
    varies = row[f"{p}_wmin"] != row[f"{p}_wmax"]
    explains = float(row[f"{p}_cov"]) / float(row[f"{p}_var"]) if varies else None
    return Part(n, float(row[f"{p}_median"]),
                _f(row[f"{p}_slow"]) if int(row[f"{p}_slow_n"] or 0) else None,
                _f(row[f"{p}_fast"]) if int(row[f"{p}_fast_n"] or 0) else None,
                explains, float(row[f"{p}_max"]))


def stage_signal(row: Mapping[str, Any], limit_cpus: float | None = None,
                 pressure_scope: str | None = None) -> StageSignals:
    """One stage's :class:`~otel_stages.analysis.mechanisms.StageSignals` (parts only; the rules
    add the mechanisms) from a ``stage_signals_sql`` row; ``pressure_scope`` of the CPU pressure
    (:func:`scope_of`), kept where the stage has a pressure part."""
    pressure = part(row, "pressure")
    sd_n = int(row["sd_n"] or 0)
    slowdown = (float(row["sd_cov"]) / float(row["sd_var"])
                if sd_n >= 2 and row["sd_min"] != row["sd_max"] else None)
    return StageSignals(
        str(row["stage"]), int(row["n"]), float(row["slow_min"]), float(row["fast_max"]),
        cpu=part(row, "cpu"), wait=part(row, "wait"), gc=part(row, "gc"), lag=part(row, "lag"),
        throttled=part(row, "throttled"), pressure=pressure,
        runq=part(row, "runq"), blocked=part(row, "blocked"),
        pressure_scope=None if pressure is None else pressure_scope,
        slow_cpu_utilization=_f(row["util_slow"]) if int(row["util_slow_n"] or 0) else None,
        tail_cpu_utilization=_f(row["util_tail"]) if int(row["util_tail_n"] or 0) else None,
        fast_cpu_utilization=_f(row["util_fast"]) if int(row["util_fast_n"] or 0) else None,
        busy_utilization=_f(row["busy"]) if int(row["util_n"] or 0) else None,
        slowdown_explains=slowdown, limit_cpus=limit_cpus,
    )


@dataclass(frozen=True)
class MemoryGpu:
    """A GPU memory series as a request process sees it (``proc_key``, ``hw``): points, limit
    points, the largest limit (bytes) and ``read``: whether the memory rule reads it (its
    process's model GPU, or every readable series of a process without one:
    :mod:`otel_stages.analysis.gpu_memory`; ``memory_gpus_sql`` decides)."""

    hw: str
    usage_points: int
    limit_points: int
    limit_bytes: float
    proc_key: int = 0
    read: bool = True

    @property
    def readable(self) -> bool:
        """Memory points and a positive limit: the memory rule reads it."""
        return bool(self.usage_points and self.limit_points and self.limit_bytes > 0)


@dataclass(frozen=True)
class ScopeSignals:
    """The signals of one scope: all warm requests (``width`` / ``height`` / ``format`` all
    ``None``) or one cohort. ``stages``: parts per stage (no mechanisms yet); ``held``: per
    stage, spans that held the event loop; ``memory``: the GPU memory evidence for its forwards
    (``None`` without memory and limit points)."""

    width: int | None
    height: int | None
    format: str | None
    stages: dict[str, StageSignals] = field(default_factory=dict)
    held: dict[str, Held] = field(default_factory=dict)
    memory: MemoryEvidence | None = None


def memory_evidence(gpus: Sequence[MemoryGpu], windows: Mapping[str, Any] | None,
                    forwards: Sequence[Mapping[str, Any]]) -> MemoryEvidence | None:
    """:class:`~otel_stages.analysis.gpu_memory.MemoryEvidence` for one scope: its forward
    windows' row (``memory_windows_sql``: count, median, processes) and its covered forward rows
    (``memory_forwards_sql``: each forward over the GPU series read for its process, each
    repeated ``mult`` times). The series read are the :attr:`MemoryGpu.read` (and readable) ones of the
    scope's processes, as :func:`otel_stages.analysis.gpu_memory.memory_evidence` reads them;
    ``None`` without one."""
    if windows is None or not int(windows["n"] or 0):
        return None
    procs = {int(p) for p in windows.get("procs") or ()}
    read = [g for g in gpus if g.read and g.readable and g.proc_key in procs]
    if not read:
        return None
    covered = tuple(
        ForwardMemory(float(r["ms"]), float(r["peak"]), float(r["spread"]), int(r["n"]),
                      float(r["freed"]))
        for r in forwards for _ in range(int(r["mult"])))
    ids = {hw_of(g.hw) for g in read}
    # the noise band is set where the stage figures are
    return MemoryEvidence(covered, int(windows["n"]), max(g.limit_bytes for g in read),
                          (next(iter(ids)) or None) if len(ids) == 1 else None,
                          float(windows["median_ms"]), gpus=len(read))


def held(rows: Sequence[Mapping[str, Any]]) -> dict[str, Held]:
    """``held_sql`` rows (of one scope) -> :class:`~otel_stages.analysis.mechanisms.Held`."""
    return {str(r["name"]): Held(int(r["n"]), float(r["median_ms"]), float(r["max_ms"]),
                                 float(r["sum_ms"])) for r in rows}


def memory_gpus(rows: Sequence[Mapping[str, Any]]) -> list[MemoryGpu]:
    """``memory_gpus_sql`` rows -> :class:`MemoryGpu` (GPUs without points left out)."""
    return [MemoryGpu(str(r["hw"]), int(r["n_usage"] or 0), int(r["n_limit"] or 0),
                      float(r["limit_bytes"] or 0.0), int(r.get("proc_key") or 0),
                      bool(r.get("read", True))) for r in rows]


def scope_of(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """``pressure_scope_sql``'s row -> ``cgroup`` (every point read from the cgroup), ``host``
    (any other), ``None`` (no points)."""
    n = int(rows[0]["n"] or 0) if rows else 0
    if not n:
        return None
    return (semconv.PRESSURE_SCOPE_CGROUP if int(rows[0]["cgroup_n"] or 0) == n
            else semconv.PRESSURE_SCOPE_HOST)


def _cohort(row: Mapping[str, Any]) -> tuple[Any, Any, Any]:
    return row["width"], row["height"], row["fmt"]


def scopes(results: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[ScopeSignals]:
    """The whole window's :class:`ScopeSignals` first, then one per cohort with signal rows, from
    the named answers (``signal_stages``, ``signal_cohort_stages``, ``held``, ``cohort_held``,
    ``memory_gpus``, ``memory_windows``, ``cohort_memory_windows``, ``memory_forwards``,
    ``limit``, ``pressure_scope``; any may be missing)."""
    stage_rows = results.get("signal_stages") or []
    gpus = memory_gpus(results.get("memory_gpus") or [])
    limit_rows = results.get("limit") or []
    limit = _f(limit_rows[0]["limit_cpus"]) if limit_rows else None
    scope = scope_of(results.get("pressure_scope") or [])
    if not stage_rows and not gpus:
        return []
    forwards = results.get("memory_forwards") or []
    windows = results.get("memory_windows") or []
    out = [ScopeSignals(
        None, None, None, {str(r["stage"]): stage_signal(r, limit, scope) for r in stage_rows},
        held(results.get("held") or []),
        memory_evidence(gpus, windows[0] if windows else None, forwards))]
    by_cohort: dict[tuple[Any, Any, Any], list[Mapping[str, Any]]] = {}
    for r in results.get("signal_cohort_stages") or []:
        by_cohort.setdefault(_cohort(r), []).append(r)
    for key, rows in by_cohort.items():
        w, h, fmt = key
        own_windows = [r for r in results.get("cohort_memory_windows") or [] if _cohort(r) == key]
        out.append(ScopeSignals(
            int(w), int(h), fmt or None, {str(r["stage"]): stage_signal(r, limit, scope) for r in rows},
            held([r for r in results.get("cohort_held") or [] if _cohort(r) == key]),
            memory_evidence(gpus, own_windows[0] if own_windows else None,
                            [r for r in forwards if _cohort(r) == key])))
    return out
