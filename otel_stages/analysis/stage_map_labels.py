"""Each stage's time per label value (Triton: per model) over the warm requests. Pure.

A stage made of several models (an ensemble's composing models in ``forward``) shows what each
one took, and which one swings: per label value its median, its swing (p95 - p5, as the stage
table) and, with at least :data:`~otel_stages.analysis.decision.MIN_WARM_RUNS` warm requests, its
part of the variance of the request total (``cov(model ms, total) / var(total)``, a request that
did not run the model counting 0 ms; the stage table's ``explains``). Values are listed by that
part (by swing where it is unknown), so the model that swings leads even when its median is small.

The requests counted are the report's warm ones: the first request of a process, failed requests
and requests set apart (first of a new input, after an idle gap) are left out, as in the stage
table (:func:`warm_requests`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from otel_stages.analysis.model import Recording
from otel_stages.analysis.requests import Request, find_requests
from otel_stages.analysis.stats import distribution, explained_fraction, order_stages
from otel_stages.analysis.units import duration, pct


@dataclass(frozen=True)
class LabelStats:
    """One label value's time in one stage over the warm requests that ran it (ms)."""

    requests: int
    median_ms: float
    swing_ms: float  #: p95 - p5
    total_ms: float  #: summed over those requests
    #: part of the variance of the request total (fraction); ``None`` below MIN_WARM_RUNS
    explains: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        """``{"requests", "median_ms", "swing_ms", "total_ms", "explains"}``."""
        return {"requests": self.requests, "median_ms": round(self.median_ms, 3),
                "swing_ms": round(self.swing_ms, 3), "total_ms": round(self.total_ms, 3),
                "explains": None if self.explains is None else round(self.explains, 4)}

    def rank(self) -> tuple[float, float, float]:
        """Sort key, largest first: the part of the variance, then the swing, then the time."""
        return (-(self.explains if self.explains is not None else -1.0), -self.swing_ms,
                -self.total_ms)


def warm_requests(recording: Recording) -> list[Request]:
    """The requests the report's stage table counts (module docstring)."""
    from otel_stages.analysis.cohorts import CohortKeys, find_set_apart

    requests = find_requests(recording.spans)
    apart = {id(a.request) for a in find_set_apart(requests, CohortKeys(requests))}
    return [r for r in requests if not r.cold and not r.error and id(r) not in apart]


def label_stats(warm: Sequence[Request], label: str) -> dict[str, dict[str, LabelStats]]:
    """stage -> label value -> :class:`LabelStats` (values in rank order), from the stage spans
    of ``warm`` that carry ``label``; the part of each stage span inside its request counts."""
    from otel_stages.analysis.decision import MIN_WARM_RUNS

    per: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    for i, r in enumerate(warm):
        for s in r.spans:
            value = s.attributes.get(label)
            if value is None or value == "":
                continue
            ms = max(0, min(s.end_ns, r.end_ns) - max(s.start_ns, r.start_ns)) / 1e6
            ran = per[s.name][str(value)]
            ran[i] = ran.get(i, 0.0) + ms
    totals = [r.total_ms for r in warm]
    out: dict[str, dict[str, LabelStats]] = {}
    for stage, by in per.items():
        stats: dict[str, LabelStats] = {}
        for value, ran in by.items():
            dist = distribution(list(ran.values()))
            explains = (explained_fraction([ran.get(i, 0.0) for i in range(len(warm))], totals)
                        if len(warm) >= MIN_WARM_RUNS else None)
            stats[value] = LabelStats(len(ran), dist.median_ms, dist.swing_ms,
                                      sum(ran.values()), explains)
        out[stage] = dict(sorted(stats.items(), key=lambda kv: (kv[1].rank(), kv[0])))
    return out


def labels_to_dict(labels: Mapping[str, Mapping[str, LabelStats]]) -> dict[str, object]:
    """``{stage: {label value: LabelStats.to_dict()}}``, values in rank order."""
    return {stage: {value: s.to_dict() for value, s in by.items()} for stage, by in labels.items()}


def label_lines(name: str, label: str | None,
                labels: Mapping[str, Mapping[str, LabelStats]]) -> list[str]:
    """``Stage map NAME, time per LABEL ...`` and one line per stage (the report's stage order):
    ``  forward:`` then ``    image_encoder 16.0 ms, swing 34.6 ms, explains 98% (59 requests)``
    per label value, largest first. Empty
    unless some stage holds the time of more than one label value (one model per stage says
    nothing the table does not)."""
    if label is None or not any(len(by) > 1 for by in labels.values()):
        return []
    out = [f"Stage map {name}, time per {label} over the warm requests (median, swing = p95 - p5,"
           " explains = part of the total's variance; largest first):"]
    for stage in order_stages(labels):
        out.append(f"  {stage}:")
        for value, s in labels[stage].items():
            explains = "" if s.explains is None else f", explains {pct(s.explains)}"
            out.append(f"    {value} {duration(s.median_ms)}, swing {duration(s.swing_ms)}"
                       f"{explains} ({s.requests} request{'s' if s.requests != 1 else ''})")
    return out
