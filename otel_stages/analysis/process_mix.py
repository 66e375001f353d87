"""How much of the request total's swing lies between processes: replicas that differ.

A service on two nodes, one with a slower GPU (an A100 beside an H100), each steady: every slow
forward ran on one node, so ``forward`` swings and the verdict names a stage cause (``gpu_busy``:
both GPUs are busy) for what is a difference between replicas, not a swing within any one of
them. The same for a node with co-tenants, an older version or other batch settings. So the warm
requests' totals are grouped by process (:func:`otel_stages.analysis.requests.process_key`) and,
as for the input mix (:func:`otel_stages.analysis.stats.variance_explained_by_groups`: omega
squared, which does not reward many small groups), the part of their variance between processes
is measured. When it is :data:`PROCESS_MIX_DOMINATES` or more, the fastest and the slowest process
by mean total ran at the same time (their warm requests' spans of time overlap: processes that ran
one after another, a rolling restart or a worker recycled every N requests, differ by when they
ran, and a load that rose over the recording would read as a slower replica), and the input mix
does not already explain the swing (inputs routed per process), the verdict is tentative, the
evidence says so first with those two processes, and the advice is to compare them.
The ClickHouse report computes the same figures in SQL
(:func:`otel_stages.analysis.clickhouse_queries.process_mix_sql`). Pure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from otel_stages.analysis.requests import Request, process_keys
from otel_stages.analysis.stats import variance_explained_by_groups
from otel_stages.analysis.units import duration, pct

#: The part of the warm request total's variance between processes from which the swing is
#: called one between processes (a slower replica), the verdict tentative (module docstring).
#: The same bar as the input mix's (``decision.INPUT_MIX_DOMINATES``): half the variance.
PROCESS_MIX_DOMINATES = 0.5


@dataclass(frozen=True)
class ProcessMean:
    """One process's warm requests: its key (``process_key``), how many, their mean total (ms),
    the first one's start and the last one's end (Unix ns)."""

    key: str
    requests: int
    mean_total_ms: float
    first_ns: int = 0
    last_ns: int = 0

    def to_dict(self) -> dict[str, object]:
        """JSON form."""
        return {"process": self.key, "requests": self.requests,
                "mean_total_ms": round(self.mean_total_ms, 3)}


@dataclass(frozen=True)
class ProcessMix:
    """``explains``: the part (0..1) of the warm request total's variance between ``processes``
    processes (omega squared); ``fastest`` / ``slowest``: the processes with the lowest and the
    highest mean total (ties by key)."""

    explains: float
    processes: int
    fastest: ProcessMean
    slowest: ProcessMean

    @property
    def dominates(self) -> bool:
        """Whether the swing lies between processes (:data:`PROCESS_MIX_DOMINATES`) that ran at
        the same time (module docstring)."""
        fast, slow = self.fastest, self.slowest
        together = fast.first_ns < slow.last_ns and slow.first_ns < fast.last_ns
        return self.explains >= PROCESS_MIX_DOMINATES and together

    def describe(self) -> str:
        """The evidence sentence."""
        fast, slow = self.fastest, self.slowest
        return (f"the process explains {pct(self.explains)} of the variance of the request total"
                f" ({self.processes} processes; mean total from {duration(fast.mean_total_ms)}"
                f" ({fast.key or '(no service)'}, {fast.requests} warm requests) to"
                f" {duration(slow.mean_total_ms)} ({slow.key or '(no service)'}, {slow.requests}):"
                " requests differ by where they ran (a slower replica: another GPU model,"
                " co-tenants, another version or batch setting), not by a swing within one process;"
                " the verdict below pools the processes and is tentative")

    def advice(self) -> str:
        """The advice line, first when the mix dominates."""
        return (f"compare {self.slowest.key or '(no service)'} with {self.fastest.key or '(no service)'}"
                " (hw.model, driver, co-tenants, version, batch settings) before tuning a stage;"
                " a report of one process's spans alone shows its own swing")

    def to_dict(self) -> dict[str, object]:
        """The report's ``process_mix`` object."""
        return {"explains": round(self.explains, 4), "processes": self.processes,
                "fastest": self.fastest.to_dict(), "slowest": self.slowest.to_dict()}


def process_mix(warm: Sequence[Request]) -> ProcessMix | None:
    """The :class:`ProcessMix` of the warm requests' totals; ``None`` with fewer than 2
    processes, no within-process degrees of freedom, or a constant total."""
    totals: dict[str, list[float]] = defaultdict(list)
    spans: dict[str, tuple[int, int]] = {}
    for r, key in zip(warm, process_keys(warm)):
        totals[key].append(r.total_ms)
        first, last = spans.get(key, (r.start_ns, r.end_ns))
        spans[key] = (min(first, r.start_ns), max(last, r.end_ns))
    explains = variance_explained_by_groups(totals.values())
    if explains is None:
        return None
    means = sorted((math.fsum(v) / len(v), key, len(v)) for key, v in totals.items())
    fast, slow = means[0], means[-1]
    return ProcessMix(explains=explains, processes=len(totals),
                      fastest=ProcessMean(fast[1], fast[2], fast[0], *spans[fast[1]]),
                      slowest=ProcessMean(slow[1], slow[2], slow[0], *spans[slow[1]]))

