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

Processes that ran one after another do count when the fastest and the slowest ran different
``service.version``s (each one's single version; none, or several in one process, is no version)
and the versions explain what the processes do (:data:`VERSION_MIX_MIN_SHARE`):
a deploy during the recording (pod ``1.4.0`` served, then pod ``1.5.0`` with a forward twice as
long) reads as a swing of the forward, and "add GPU capacity" for a regression of the new
version. Then, whether they overlapped or not, the verdict is tentative, the evidence says first
that the latency changed with the version, and the advice leads with comparing the versions. Two
processes of one version (or none) that ran one after the other keep the rule above: the
recycled worker under a rising load is still no slower replica.
The ClickHouse report computes the same figures in SQL
(:func:`otel_stages.analysis.clickhouse_queries.process_mix_sql`; the two processes' versions by
:func:`otel_stages.analysis.clickhouse_queries.process_versions_sql`, read only when the mix
explains :data:`PROCESS_MIX_DOMINATES` or more). Pure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from otel_stages import semconv
from otel_stages.analysis.requests import Request, attribute_text, process_keys
from otel_stages.analysis.stats import variance_explained_by_groups
from otel_stages.analysis.units import duration, pct

#: The part of the warm request total's variance between processes from which the swing is
#: called one between processes (a slower replica), the verdict tentative (module docstring).
#: The same bar as the input mix's (``decision.INPUT_MIX_DOMINATES``): half the variance.
PROCESS_MIX_DOMINATES = 0.5
#: The versions account for the differences between processes when the warm totals grouped by
#: version (each process's one ``service.version``) explain at least this part of what the
#: processes explain (both omega squared): the processes of one version are alike. Under it the
#: fastest and the slowest process may differ by version and by something else (a tester's: v1.0
#: on a fast node at 134 ms, v1.0 and the v1.1 canary on slow nodes at 225-230 ms read as "the
#: request total changed with the version"), and the processes are compared as replicas.
VERSION_MIX_MIN_SHARE = 0.8


@dataclass(frozen=True)
class ProcessMean:
    """One process's warm requests: its key (``process_key``), how many, their mean total (ms),
    the first one's start and the last one's end (Unix ns), and its ``service.version`` (``""``:
    not set, not one (its requests carry several), or not read: the mix explains less than
    :data:`PROCESS_MIX_DOMINATES`)."""

    key: str
    requests: int
    mean_total_ms: float
    first_ns: int = 0
    last_ns: int = 0
    version: str = ""

    @property
    def name(self) -> str:
        """The key as the evidence names it."""
        return self.key or "(no service)"

    def to_dict(self) -> dict[str, object]:
        """JSON form (``service_version``: ``None`` where :attr:`version` is ``""``)."""
        return {"process": self.key, "requests": self.requests,
                "mean_total_ms": round(self.mean_total_ms, 3),
                "service_version": self.version or None}


@dataclass(frozen=True)
class ProcessMix:
    """``explains``: the part (0..1) of the warm request total's variance between ``processes``
    processes (omega squared); ``fastest`` / ``slowest``: the processes with the lowest and the
    highest mean total (ties by key)."""

    explains: float
    processes: int
    fastest: ProcessMean
    slowest: ProcessMean
    #: the part of the warm totals' variance between versions (omega squared over each process's
    #: one version, ``""`` for none); ``None``: not read (the mix does not dominate) or one group
    version_explains: float | None = None

    @property
    def together(self) -> bool:
        """Whether the fastest and the slowest process ran at the same time (their warm requests'
        spans of time overlap)."""
        fast, slow = self.fastest, self.slowest
        return fast.first_ns < slow.last_ns and slow.first_ns < fast.last_ns

    @property
    def versions_differ(self) -> bool:
        """Whether the fastest and the slowest process each ran one ``service.version`` and the
        two differ."""
        fast, slow = self.fastest.version, self.slowest.version
        return bool(fast and slow and fast != slow) and self.versions_explain

    @property
    def versions_explain(self) -> bool:
        """Whether the versions account for the differences between processes
        (:data:`VERSION_MIX_MIN_SHARE` of :attr:`explains`)."""
        return (self.version_explains is not None
                and self.version_explains >= VERSION_MIX_MIN_SHARE * self.explains)

    @property
    def dominates(self) -> bool:
        """Whether the swing lies between processes (:data:`PROCESS_MIX_DOMINATES`) that ran at
        the same time, or ran different versions at any time (module docstring)."""
        return self.explains >= PROCESS_MIX_DOMINATES and (self.together or self.versions_differ)

    def describe(self) -> str:
        """The evidence sentence: the version change first where the versions differ."""
        fast, slow = self.fastest, self.slowest
        share = f"the process explains {pct(self.explains)} of the variance of the request total"
        if self.versions_differ:
            return f"{self._version_text()}; {share} ({self.processes} processes)"
        return (f"{share}"
                f" ({self.processes} processes; mean total from {duration(fast.mean_total_ms)}"
                f" ({fast.name}, {fast.requests} warm requests) to"
                f" {duration(slow.mean_total_ms)} ({slow.name}, {slow.requests}):"
                " requests differ by where they ran (a slower replica: another GPU model,"
                " co-tenants, another version or batch setting), not by a swing within one process;"
                " the verdict below pools the processes and is tentative")

    def _version_text(self) -> str:
        """The latency's change with the version: the earlier process first when they ran one
        after the other (a deploy), else the faster."""
        first, then = self.fastest, self.slowest
        if not self.together and then.first_ns < first.first_ns:
            first, then = then, first
        change = then.mean_total_ms / first.mean_total_ms - 1 if first.mean_total_ms > 0 else None
        how = f", {change:+.0%}" if change is not None else ""
        when = ("one after the other (a deploy during the recording)" if not self.together
                else "side by side (a canary or a partial rollout)")
        return (f"the request total changed with the version (service.version): mean total"
                f" {duration(first.mean_total_ms)} on {first.version} ({first.name},"
                f" {first.requests} warm requests), {duration(then.mean_total_ms)} on {then.version}"
                f" ({then.name}, {then.requests}{how}); they ran {when}: requests differ by the"
                " version they ran, not by a swing within one process; the verdict below pools the"
                " versions and is tentative")

    def advice(self) -> str:
        """The advice line, first when the mix dominates."""
        fast, slow = self.fastest, self.slowest
        if self.versions_differ:
            return (f"compare service.version {slow.version} ({slow.name}) with {fast.version}"
                    f" ({fast.name}) before adding GPU capacity or tuning a stage: write each"
                    " version's spans to its own file and run"
                    f" `otel-stages report {slow.version}.jsonl --baseline {fast.version}.jsonl`;"
                    f" the stages that moved are what {slow.version} changed (a regression to fix"
                    " in the code or its settings, not load)")
        return (f"compare {slow.name} with {fast.name}"
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
    keys = process_keys(warm)
    for r, key in zip(warm, keys):
        totals[key].append(r.total_ms)
        first, last = spans.get(key, (r.start_ns, r.end_ns))
        spans[key] = (min(first, r.start_ns), max(last, r.end_ns))
    explains = variance_explained_by_groups(totals.values())
    if explains is None:
        return None
    means = sorted((math.fsum(v) / len(v), key, len(v)) for key, v in totals.items())
    fast, slow = means[0], means[-1]
    # the versions matter only to a dominating mix: read them then (as the SQL does)
    versions: dict[str, set[str]] = defaultdict(set)
    version_explains = None
    if explains >= PROCESS_MIX_DOMINATES:
        seen: set[int] = set()  # resources read (loaders share one per process)
        for r, key in zip(warm, keys):
            if id(r.resource) not in seen:
                seen.add(id(r.resource))
                versions[key].add(_version(r))
        by_version: dict[str, list[float]] = defaultdict(list)
        for key, values in totals.items():
            by_version[one_version(versions[key])].extend(values)
        version_explains = variance_explained_by_groups(by_version.values())
    return ProcessMix(explains=explains, processes=len(totals), version_explains=version_explains,
                      fastest=ProcessMean(fast[1], fast[2], fast[0], *spans[fast[1]],
                                          version=one_version(versions[fast[1]])),
                      slowest=ProcessMean(slow[1], slow[2], slow[0], *spans[slow[1]],
                                          version=one_version(versions[slow[1]])))


def _version(request: Request) -> str:
    """The request's resource's ``service.version`` as text (``""``: not set)."""
    value = request.resource.get(semconv.SERVICE_VERSION)
    return "" if value in (None, "") else attribute_text(value)


def one_version(versions: set[str] | Sequence[str]) -> str:
    """A process's version from the versions (``""``: not set) its requests carry: the one, or
    ``""`` with none or several (a restart under one instance id: no one version)."""
    return next(iter(versions)) if len(set(versions)) == 1 else ""

