"""The report: a recording -> requests -> warm statistics -> GPU evidence -> verdict (-> comparison).

:func:`diagnose` is pure (no I/O); :meth:`Report.to_dict` is the ``otel-stages report --json``
contract (DESIGN.md section 3).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from otel_stages.analysis.batching import BatchSummary, summarize_batches
from otel_stages.analysis.comparison import Comparison, compare
from otel_stages.analysis.gpu import GpuEvidence, gpu_evidence
from otel_stages.analysis.model import Recording
from otel_stages.analysis.requests import Request, find_requests
from otel_stages.analysis.stats import Distribution, StageStats, distribution, order_stages, stage_stats
from otel_stages.analysis.verdict import ColdStart, Verdict, decide

#: Default number of slowest warm requests listed.
DEFAULT_TOP = 5


@dataclass(frozen=True)
class SlowRequest:
    """One of the slowest warm requests: total and per-stage ms, image pixels and bytes."""

    trace_id: str
    seq: int | None
    total_ms: float
    stages_ms: dict[str, float]
    image_width: int | None
    image_height: int | None
    image_bytes: int | None
    error: bool

    @classmethod
    def of(cls, req: Request) -> SlowRequest:
        """Build from a :class:`Request`."""
        return cls(
            trace_id=req.trace_id,
            seq=req.seq,
            total_ms=req.total_ms,
            stages_ms={n: req.stages_ms[n] for n in order_stages(req.stages_ms)},
            image_width=req.image_width,
            image_height=req.image_height,
            image_bytes=req.image_bytes,
            error=req.error,
        )

    def to_dict(self) -> dict[str, object]:
        """JSON form for the report's ``slowest`` list."""
        return {
            "trace_id": self.trace_id,
            "seq": self.seq,
            "total_ms": round(self.total_ms, 3),
            "stages": {k: round(v, 3) for k, v in self.stages_ms.items()},
            "image_width": self.image_width,
            "image_height": self.image_height,
            "image_bytes": self.image_bytes,
            "error": self.error,
        }


@dataclass
class Report:
    """Everything ``otel-stages report`` shows. See :meth:`to_dict` for the JSON shape.

    ``requests`` counts all requests (cold and failed included); ``warm_requests`` the warm,
    successful ones that ``stages`` (ordered: standard stages in pipeline order, then custom) and
    ``total`` describe.
    ``groups`` maps each custom stage that holds other stage spans (``preprocess`` around
    ``decode``/``resize``) to those stages' names: a group is not a row of ``stages``, its
    children are (see :mod:`otel_stages.analysis.requests`).
    """

    requests: int
    warm_requests: int
    failed_requests: int
    stages: dict[str, StageStats]
    total: Distribution | None
    cold_start: ColdStart | None
    verdict: Verdict
    gpu: GpuEvidence
    slowest: list[SlowRequest] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    comparison: Comparison | None = None
    groups: dict[str, list[str]] = field(default_factory=dict)
    batches: BatchSummary | None = None  #: batch sizes and fill waits (analysis.batching)

    def to_dict(self) -> dict[str, object]:
        """``{"requests", "stages", "cold_start", "verdict", "gpu", "slowest", "problems",
        "comparison", "batches"}`` with ms values rounded to microseconds."""
        return {
            "requests": self.requests,
            "stages": {name: s.to_dict() for name, s in self.stages.items()},
            "cold_start": None if self.cold_start is None else self.cold_start.to_dict(),
            "verdict": self.verdict.to_dict(),
            "gpu": self.gpu.to_dict(),
            "slowest": [s.to_dict() for s in self.slowest],
            "problems": list(self.problems),
            "comparison": None if self.comparison is None else self.comparison.to_dict(),
            "batches": None if self.batches is None else self.batches.to_dict(),
        }


def _cold_summary(cold: list[Request], total: Distribution | None) -> ColdStart | None:
    if not cold:
        return None
    stage_values: dict[str, list[float]] = {}
    for req in cold:
        for name, ms in req.stages_ms.items():
            stage_values.setdefault(name, []).append(ms)
    return ColdStart(
        total_ms=statistics.median(r.total_ms for r in cold),
        warm_median_total_ms=total.median_ms if total else None,
        stages_ms={n: statistics.median(stage_values[n]) for n in order_stages(stage_values)},
        count=len(cold),
    )


def _groups(requests: list[Request]) -> dict[str, list[str]]:
    found: dict[str, set[str]] = {}
    for req in requests:
        for group in req.groups:
            found.setdefault(group.name, set()).update(
                s.name for s in (*req.spans, *req.groups)
                if s.parent_span_id == group.span_id and s.trace_id == group.trace_id
            )
    return {name: order_stages(kids) for name, kids in sorted(found.items())}


def diagnose(
    recording: Recording, *, baseline: Recording | None = None, top: int = DEFAULT_TOP
) -> Report:
    """Diagnose ``recording``: find requests, split off cold ones, compute warm-run stats, GPU
    evidence and the verdict. ``baseline`` (the same inputs before a change) fills
    ``comparison``; its problems are added prefixed with ``baseline:``. ``top`` is how many
    slowest warm requests to list. Pure; never raises for odd input (an empty recording gives a
    report with ``requests == 0`` and ``verdict.cause is None``).
    """
    requests = find_requests(recording.spans)
    # A failed request stopped early: its short stages would pose as fast runs, so it is counted
    # but kept out of the statistics.
    failed = [r for r in requests if r.error]
    warm = [r for r in requests if not r.cold and not r.error]
    cold = [r for r in requests if r.cold]
    totals = [r.total_ms for r in warm]
    stages = stage_stats([r.stages_ms for r in warm], totals)
    total = distribution(totals) if totals else None
    cold_start = _cold_summary(cold, total)
    gpu = gpu_evidence(warm, recording.metrics)
    verdict = decide(warm, stages, total, cold_start, gpu)
    if failed:
        verb = "was" if len(failed) == 1 else "were"
        verdict.evidence.append(
            f"{len(failed)} of {len(requests)} requests ended with an error and {verb} left out of"
            " the stage statistics")
    problems = list(recording.problems)
    if recording.spans and not requests:
        problems.append(
            f"{len(recording.spans)} spans read but none is a stage span (expected spans named"
            " download/decode/resize/queue/forward, or children of a 'request' span)"
        )
    report = Report(
        requests=len(requests),
        warm_requests=len(warm),
        failed_requests=len(failed),
        stages=stages,
        total=total,
        cold_start=cold_start,
        verdict=verdict,
        gpu=gpu,
        slowest=[SlowRequest.of(r) for r in sorted(warm, key=lambda r: -r.total_ms)[: max(top, 0)]],
        problems=problems,
        groups=_groups(requests),
        batches=summarize_batches(recording.spans),
    )
    if baseline is not None:
        before = diagnose(baseline, top=top)
        report.problems.extend(f"baseline: {p}" for p in before.problems)
        report.comparison = compare(before, report)
    return report
