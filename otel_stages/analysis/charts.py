"""What the HTML report plots, as plain data: built here from the analysis, drawn by
:mod:`otel_stages.html_report` (which computes nothing).

:func:`report_charts` is the one adapter: ``Recording`` (+ baseline ``Recording``) ->
:func:`~otel_stages.analysis.diagnose` -> :class:`ReportCharts`. Figures come from the diagnosis
through ``Report.to_dict()`` (the ``report --json`` contract of DESIGN.md section 3: ``verdict``,
``counts``, ``cohorts``, ``input_mix_explains``, ``comparison``), so a new analysis behind the same
contract needs no change here; where a key of the contract is absent it falls back as documented
on each field. Single requests (dots, waterfall rows) come from the report's own
:class:`~otel_stages.analysis.report.RequestSets`: the same warm, cold, set-apart and failed
requests and the same cohort keys as the text report, never a second classification.

Units: ms for durations, seconds for positions on the recording's time axis (from
:attr:`ReportCharts.origin_unix_ns`), bytes, pixels, utilization 0..1. Percentiles use
:func:`otel_stages.analysis.stats.distribution` (the report's own definitions), so a plot and the
text report agree on every median, p5 and p95.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from otel_stages import semconv
from otel_stages.analysis.gpu_series import GpuSeries, gpu_series
from otel_stages.analysis.model import Recording
from otel_stages.analysis.requests import Request
from otel_stages.analysis.stats import Distribution, distribution, order_stages

if TYPE_CHECKING:
    from otel_stages.analysis.report import Report, RequestSets

#: GPU samples are kept from this long before the first request to after the last one (seconds, or
#: ``GPU_PAD_FRACTION`` of the requests' time span when that is longer): a metrics file that covers
#: hours must not squash the minutes the requests ran into a sliver of the plot.
GPU_PAD_S = 1.0
GPU_PAD_FRACTION = 0.05
#: Name of the series (and waterfall segments) for request time outside every stage span.
UNACCOUNTED = "unaccounted"
#: Name of the request-total series.
TOTAL = "total"
#: ``ImagePoint.kind`` / waterfall labels: warm, first request of a process, set apart as cold.
WARM, COLD, SET_APART = "warm", "cold", "set_apart"


@dataclass(frozen=True)
class Segment:
    """One stage span of a request: ``start_ms`` after the request started, ``duration_ms`` long."""

    stage: str
    start_ms: float
    duration_ms: float


@dataclass(frozen=True)
class WaterfallRow:
    """A request drawn as a waterfall: ``label`` is ``"slowest warm"``, ``"median warm"``,
    ``"cold"`` or ``"set apart (new input)"`` / ``"set apart (after idle)"``; ``segments`` are its
    leaf stage spans; ``gaps`` the stretches of the request no stage span covers (stage
    ``"unaccounted"``), which add up to ``unaccounted_ms``, the report's own figure."""

    label: str
    trace_id: str
    seq: int | None
    total_ms: float
    segments: tuple[Segment, ...]
    gaps: tuple[Segment, ...] = ()
    unaccounted_ms: float = 0.0


@dataclass(frozen=True)
class StageSeries:
    """One stage's per-request durations (ms).

    ``warm_ms``: the report's warm requests, in time order; ``warm``: their distribution (``None``
    when the stage never ran warm); ``cold_ms``: the first request(s) of a process; ``apart_ms``:
    warm requests the report set apart as cold; ``baseline_ms`` / ``baseline``: the baseline's
    warm requests (empty / ``None`` without one); ``change_pct`` and ``significant`` from the
    contract's ``comparison.stages[name]`` (``comparison.total`` for the total; ``None`` when
    absent: no baseline, a row the comparison does not test, or an analysis that does not test
    significance). ``inconclusive``: the comparison lists the row as inconclusive (not
    significant, and not to be called noise: ``comparison.inconclusive``).
    """

    name: str
    warm_ms: tuple[float, ...]
    warm: Distribution | None
    cold_ms: tuple[float, ...] = ()
    apart_ms: tuple[float, ...] = ()
    baseline_ms: tuple[float, ...] = ()
    baseline: Distribution | None = None
    change_pct: float | None = None
    significant: bool | None = None
    inconclusive: bool = False


@dataclass(frozen=True)
class CohortSeries:
    """Warm requests with the same input (``key``: the report's cohort key, e.g. ``"1024x768"``,
    ``"1024x768 PNG"``): their totals (ms), the totals' distribution, each stage's median (and
    ``"unaccounted"``'s), and the cohort's own verdict when the contract's ``cohorts`` entry has
    one (``tentative``: fewer than 20 warm requests in it)."""

    key: str
    totals_ms: tuple[float, ...]
    total: Distribution
    stage_medians_ms: dict[str, float]
    cause: str | None = None
    stage: str | None = None
    tentative: bool = False


@dataclass(frozen=True)
class ImagePoint:
    """One successful request's image and its preprocessing time: pixels (width * height, as
    displayed), encoded ``bytes``, ``decode_ms`` / ``resize_ms`` (``None`` when the stage did not
    run); ``kind``: ``"warm"``, ``"cold"`` (first of a process) or ``"set_apart"``."""

    trace_id: str
    width: int | None
    height: int | None
    bytes: int | None
    decode_ms: float | None
    resize_ms: float | None
    kind: str = WARM

    @property
    def pixels(self) -> int | None:
        """width * height, ``None`` when unknown."""
        return None if self.width is None or self.height is None else self.width * self.height


@dataclass(frozen=True)
class ReportCharts:
    """Everything the HTML report draws; see the module docstring for units.

    - ``counts``: ``requests``, then the contract's ``counts`` (``warm``, ``cold`` (set-apart
      included), ``failed``, ``incomplete``) and ``set_apart``;
    - ``verdict``: the contract's ``verdict`` object as is (``cause``, ``stage``, ``evidence``,
      ``advice``, ``tentative``);
    - ``stages``: one :class:`StageSeries` per stage, pipeline order, stages of the baseline too;
      ``unaccounted`` and ``total``: the same for time outside every stage span and for the
      request total (``None`` without requests);
    - ``cohorts``: the contract's ``cohorts``, largest first; ``input_mix_explains``: the part of
      the total's variance they explain (``None``: unknown);
    - ``waterfall``: the slowest warm, the median warm (total closest to the median), the cold
      request and the set-apart request that stands out most, those that exist;
    - ``images``: successful requests with a known image size or byte count;
    - ``gpu`` and ``forward_windows_s``: GPU samples and the ``(start_s, end_s)`` of every forward
      span (a batch's shared forward once), on the same axis;
    - ``comparison``: the contract's ``comparison.summary`` sentences (empty without baseline);
      ``has_baseline``: a baseline was given;
    - ``problems``: input problems, as the report lists them.
    """

    title: str
    origin_unix_ns: int
    counts: dict[str, int]
    verdict: dict[str, Any]
    stages: tuple[StageSeries, ...]
    cohorts: tuple[CohortSeries, ...] = ()
    waterfall: tuple[WaterfallRow, ...] = ()
    images: tuple[ImagePoint, ...] = ()
    gpu: tuple[GpuSeries, ...] = ()
    forward_windows_s: tuple[tuple[float, float], ...] = ()
    comparison: tuple[str, ...] = ()
    has_baseline: bool = False
    problems: tuple[str, ...] = field(default_factory=tuple)
    unaccounted: StageSeries | None = None
    total: StageSeries | None = None
    input_mix_explains: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (dataclasses as dicts, tuples as lists)."""
        return asdict(self)


def _segments(req: Request) -> tuple[Segment, ...]:
    return tuple(
        Segment(s.name, (s.start_ns - req.start_ns) / 1e6, s.duration_ms)
        for s in sorted(req.spans, key=lambda s: (s.start_ns, s.name))
    )


def gaps(segments: Sequence[Segment], total_ms: float) -> tuple[Segment, ...]:
    """The stretches of ``[0, total_ms]`` that no segment covers (segments clipped to the
    request, as the analysis clips stage spans), as ``"unaccounted"`` segments in time order."""
    out = []
    at = 0.0
    for seg in sorted(segments, key=lambda s: s.start_ms):
        start = min(max(seg.start_ms, 0.0), total_ms)
        end = min(max(seg.start_ms + seg.duration_ms, 0.0), total_ms)
        if start > at:
            out.append(Segment(UNACCOUNTED, at, start - at))
        at = max(at, end)
    if total_ms > at:
        out.append(Segment(UNACCOUNTED, at, total_ms - at))
    return tuple(out)


def _dist(values: Sequence[float]) -> Distribution | None:
    return distribution(values) if values else None


def _waterfall(sets: RequestSets, apart_reason: Mapping[str, str]) -> tuple[WaterfallRow, ...]:
    rows: list[WaterfallRow] = []

    def add(label: str, req: Request) -> None:
        segments = _segments(req)
        rows.append(WaterfallRow(label, req.trace_id, req.seq, req.total_ms, segments,
                                 gaps(segments, req.total_ms), req.unaccounted_ms))

    warm = sets.warm
    if warm:
        slowest = max(warm, key=lambda r: r.total_ms)
        median = statistics.median(r.total_ms for r in warm)
        typical = min(warm, key=lambda r: (abs(r.total_ms - median), r.start_ns))
        add("slowest warm", slowest)
        if typical is not slowest:
            add("median warm", typical)
    if sets.cold:
        add(COLD, sets.cold[0])
    if sets.set_apart:
        worst = max(sets.set_apart, key=lambda r: r.total_ms)
        why = apart_reason.get(worst.trace_id, "").replace("_", " ")
        add(f"set apart ({why})" if why else "set apart", worst)
    return tuple(rows)


def _series(
    name: str,
    value: Callable[[Request], float | None],
    sets: RequestSets,
    base: RequestSets | None,
    change: Mapping[str, Any] | None,
    inconclusive: bool = False,
) -> StageSeries:
    def values(reqs: Sequence[Request]) -> tuple[float, ...]:
        return tuple(v for r in reqs if (v := value(r)) is not None)

    warm, before = values(sets.warm), values(base.warm if base else ())
    change = change or {}
    pct, significant = change.get("change_pct"), change.get("significant")
    return StageSeries(
        name=name,
        warm_ms=warm,
        warm=_dist(warm),
        cold_ms=values(sets.cold),
        apart_ms=values(sets.set_apart),
        baseline_ms=before,
        baseline=_dist(before),
        change_pct=float(pct) if isinstance(pct, (int, float)) else None,
        significant=significant if isinstance(significant, bool) else None,
        inconclusive=inconclusive,
    )


def _cohorts(sets: RequestSets, contract: Sequence[Mapping[str, Any]]) -> tuple[CohortSeries, ...]:
    groups: dict[str, list[Request]] = defaultdict(list)
    for req in sets.warm:
        key = sets.keys.key(req)
        if key is not None:
            groups[key].append(req)
    out = []
    for entry in contract:
        key = str(entry.get("key"))
        reqs = groups.get(key)
        if not reqs:
            continue
        totals = tuple(r.total_ms for r in reqs)
        per_stage: dict[str, list[float]] = defaultdict(list)
        for r in reqs:
            for name, ms in r.stages_ms.items():
                per_stage[name].append(ms)
        medians = {n: statistics.median(per_stage[n]) for n in order_stages(per_stage)}
        medians[UNACCOUNTED] = statistics.median(r.unaccounted_ms for r in reqs)
        v = entry.get("verdict") or {}
        out.append(CohortSeries(
            key=key,
            totals_ms=totals,
            total=distribution(totals),
            stage_medians_ms=medians,
            cause=v.get("cause"),
            stage=v.get("stage"),
            tentative=bool(v.get("tentative")),
        ))
    return tuple(out)


def _sets(recording: Recording, baseline: Recording | None, report: Any
          ) -> tuple[RequestSets, RequestSets | None]:
    sets, base = getattr(report, "request_sets", None), getattr(report, "baseline_sets", None)
    if sets is None or (baseline is not None and base is None):
        from otel_stages.analysis.diagnosis import diagnose

        again = diagnose(recording, baseline=baseline)
        sets, base = again.request_sets, again.baseline_sets
    assert sets is not None
    return sets, base


def report_charts(
    recording: Recording,
    *,
    baseline: Recording | None = None,
    report: Report | None = None,
    title: str = "otel-stages report",
) -> ReportCharts:
    """Build the HTML report's data from ``recording`` (and ``baseline``, the same inputs recorded
    before a change). ``report`` is the diagnosis of ``recording`` (with ``baseline``) when the
    caller has it already; otherwise :func:`~otel_stages.analysis.diagnose` is run here. Pure;
    never raises for odd input (an empty recording gives empty series)."""
    if report is None:
        from otel_stages.analysis.diagnosis import diagnose

        report = diagnose(recording, baseline=baseline)
    contract = report.to_dict()
    sets, base = _sets(recording, baseline, report)
    requests = sets.all
    names = order_stages({n for r in (*requests, *(base.warm if base else ())) for n in r.stages_ms})
    comparison = contract.get("comparison")
    comparison = comparison if isinstance(comparison, dict) else None
    compared = comparison.get("stages", {}) if comparison else {}
    unsure = set(comparison.get("inconclusive") or []) if comparison else set()

    origin = min((r.start_ns for r in requests), default=0)
    end = max((r.end_ns for r in requests), default=origin)
    pad = max(int(GPU_PAD_S * 1e9), int((end - origin) * GPU_PAD_FRACTION))
    windows = sorted({
        ((s - origin) / 1e9, (e - origin) / 1e9)
        for r in requests for s, e in r.stage_windows_ns(semconv.STAGE_FORWARD)
    })
    counts = contract.get("counts")
    counts = counts if isinstance(counts, dict) else {
        "warm": len(sets.warm), "cold": len(sets.cold) + len(sets.set_apart),
        "failed": len(sets.failed)}
    failures = contract.get("failures")
    counts = {"requests": len(requests), **{str(k): int(v) for k, v in counts.items()},
              "set_apart": len(sets.set_apart),
              "cold_failed": int(failures.get("cold") or 0) if isinstance(failures, dict) else 0}
    cohorts = contract.get("cohorts")
    apart = contract.get("set_apart")
    reasons = {str(a.get("trace_id")): str(a.get("reason") or "")
               for a in (apart if isinstance(apart, list) else []) if isinstance(a, dict)}
    kinds = {id(r): kind for kind, reqs in ((WARM, sets.warm), (COLD, sets.cold),
                                            (SET_APART, sets.set_apart)) for r in reqs}
    mix = contract.get("input_mix_explains")
    return ReportCharts(
        title=title,
        origin_unix_ns=origin,
        counts=counts,
        verdict=dict(verdict) if isinstance(verdict := contract.get("verdict"), dict) else {},
        stages=tuple(_series(n, _stage_ms(n), sets, base, compared.get(n), n in unsure)
                     for n in names),
        cohorts=_cohorts(sets, cohorts if isinstance(cohorts, list) else []),
        waterfall=_waterfall(sets, reasons),
        images=tuple(
            ImagePoint(r.trace_id, r.image_width, r.image_height, r.image_bytes,
                       r.stages_ms.get(semconv.STAGE_DECODE), r.stages_ms.get(semconv.STAGE_RESIZE),
                       kinds[id(r)])
            for r in requests
            if id(r) in kinds and (r.pixels is not None or r.image_bytes is not None)
        ),
        gpu=gpu_series(recording.metrics, origin, origin - pad, end + pad) if requests else (),
        forward_windows_s=tuple(windows),
        comparison=tuple(str(s) for s in (comparison or {}).get("summary", [])),
        has_baseline=baseline is not None,
        problems=tuple(str(p) for p in problems) if isinstance(
            problems := contract.get("problems"), list) else (),
        unaccounted=(_series(UNACCOUNTED, lambda r: r.unaccounted_ms, sets, base, None)
                     if requests else None),
        total=(_series(TOTAL, lambda r: r.total_ms, sets, base,
                       comparison.get("total") if comparison else None, TOTAL in unsure)
               if requests else None),
        input_mix_explains=float(mix) if isinstance(mix, (int, float)) else None,
    )


def _stage_ms(name: str) -> Callable[[Request], float | None]:
    return lambda r: r.stages_ms.get(name)
