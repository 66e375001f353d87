"""What the HTML report plots, as plain data: built here from the analysis, drawn by
:mod:`otel_stages.html_report` (which computes nothing).

:func:`report_charts` is the one adapter: ``Recording`` (+ baseline ``Recording``) ->
:func:`~otel_stages.analysis.requests.find_requests` and :func:`~otel_stages.analysis.diagnose`
-> :class:`ReportCharts`. It reads the diagnosis only through ``Report.to_dict()`` (the
``report --json`` contract of DESIGN.md section 3: ``verdict``, ``counts``, ``cohorts``,
``comparison``), so a new analysis behind the same contract needs no change here; where a key of
the contract is absent it falls back as documented on each field.

Units: ms for durations, seconds for positions on the recording's time axis (from
:attr:`ReportCharts.origin_unix_ns`), bytes, pixels, utilization 0..1. Percentiles use
:func:`otel_stages.analysis.stats.distribution` (the report's own definitions), so a plot and the
text report agree on every median, p5 and p95.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from otel_stages import semconv
from otel_stages.analysis.model import MetricPoint, Recording
from otel_stages.analysis.requests import Request, find_requests
from otel_stages.analysis.stats import Distribution, distribution, order_stages

if TYPE_CHECKING:
    from otel_stages.analysis.report import Report

#: Utilization values above this are percent (0..100) from a producer that did not divide by 100
#: (same rule as :mod:`otel_stages.analysis.gpu`).
PERCENT_GUESS = 1.5
#: GPU samples are kept from this long before the first request to after the last one (seconds, or
#: ``GPU_PAD_FRACTION`` of the requests' time span when that is longer): a metrics file that covers
#: hours must not squash the minutes the requests ran into a sliver of the plot.
GPU_PAD_S = 1.0
GPU_PAD_FRACTION = 0.05


@dataclass(frozen=True)
class Segment:
    """One stage span of a request: ``start_ms`` after the request started, ``duration_ms`` long."""

    stage: str
    start_ms: float
    duration_ms: float


@dataclass(frozen=True)
class WaterfallRow:
    """A request drawn as a waterfall: ``label`` is ``"slowest warm"``, ``"median warm"`` or
    ``"cold"``; ``segments`` are its leaf stage spans (a gap between them is time no stage
    covers)."""

    label: str
    trace_id: str
    seq: int | None
    total_ms: float
    segments: tuple[Segment, ...]


@dataclass(frozen=True)
class StageSeries:
    """One stage's per-request durations (ms).

    ``warm_ms``: warm successful requests, in time order; ``warm``: their distribution (``None``
    when the stage never ran warm); ``cold_ms``: the cold request(s); ``baseline_ms`` /
    ``baseline``: warm requests of the baseline (empty / ``None`` without one); ``change_pct``
    and ``significant`` from the contract's ``comparison.stages[name]`` (``None`` when absent:
    no baseline, or an analysis that does not test significance).
    """

    name: str
    warm_ms: tuple[float, ...]
    warm: Distribution | None
    cold_ms: tuple[float, ...] = ()
    baseline_ms: tuple[float, ...] = ()
    baseline: Distribution | None = None
    change_pct: float | None = None
    significant: bool | None = None


@dataclass(frozen=True)
class CohortSeries:
    """Warm requests with the same input (``key``, e.g. ``"1024x768"``): their totals (ms), the
    totals' distribution, each stage's median, and the cohort's own verdict when the contract's
    ``cohorts`` entry has one."""

    key: str
    totals_ms: tuple[float, ...]
    total: Distribution
    stage_medians_ms: dict[str, float]
    cause: str | None = None
    stage: str | None = None


@dataclass(frozen=True)
class ImagePoint:
    """One successful request's image and its preprocessing time: pixels (width * height, as
    displayed), encoded ``bytes``, ``decode_ms`` / ``resize_ms`` (``None`` when the stage did not
    run); ``cold`` marks the cold request."""

    trace_id: str
    width: int | None
    height: int | None
    bytes: int | None
    decode_ms: float | None
    resize_ms: float | None
    cold: bool

    @property
    def pixels(self) -> int | None:
        """width * height, ``None`` when unknown."""
        return None if self.width is None or self.height is None else self.width * self.height


@dataclass(frozen=True)
class GpuSeries:
    """One GPU (``hw.id``; ``model`` = ``hw.model``): ``utilization`` as ``(t_s, 0..1)`` and
    ``memory_used_bytes`` as ``(t_s, bytes)`` samples in time order; ``memory_limit_bytes`` the
    largest ``hw.gpu.memory.limit`` seen (``None`` without)."""

    hw_id: str
    model: str | None
    utilization: tuple[tuple[float, float], ...]
    memory_used_bytes: tuple[tuple[float, float], ...]
    memory_limit_bytes: float | None


@dataclass(frozen=True)
class ReportCharts:
    """Everything the HTML report draws; see the module docstring for units.

    - ``counts``: ``requests``, ``warm``, ``cold``, ``failed`` (the contract's ``counts`` when
      present, else counted here: failed = errored and not cold);
    - ``verdict``: the contract's ``verdict`` object as is (``cause``, ``stage``, ``evidence``,
      ``advice``, and ``tentative`` when the analysis gives it);
    - ``stages``: one :class:`StageSeries` per stage, pipeline order, stages of the baseline too;
    - ``cohorts``: largest first (the contract's ``cohorts`` order when present, else warm
      requests grouped by image ``WxH``);
    - ``waterfall``: the slowest warm, the median warm (total closest to the median) and the cold
      request, those that exist;
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

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (dataclasses as dicts, tuples as lists)."""
        return asdict(self)


def cohort_key(req: Request) -> str | None:
    """``"WxH"`` of the request's image (pixels, as displayed), ``None`` when unknown."""
    if req.image_width is None or req.image_height is None:
        return None
    return f"{req.image_width}x{req.image_height}"


def _segments(req: Request) -> tuple[Segment, ...]:
    return tuple(
        Segment(s.name, (s.start_ns - req.start_ns) / 1e6, s.duration_ms)
        for s in sorted(req.spans, key=lambda s: (s.start_ns, s.name))
    )


def _dist(values: Sequence[float]) -> Distribution | None:
    return distribution(values) if values else None


def _waterfall(warm: Sequence[Request], cold: Sequence[Request]) -> tuple[WaterfallRow, ...]:
    rows: list[WaterfallRow] = []

    def add(label: str, req: Request) -> None:
        rows.append(WaterfallRow(label, req.trace_id, req.seq, req.total_ms, _segments(req)))

    if warm:
        slowest = max(warm, key=lambda r: r.total_ms)
        median = statistics.median(r.total_ms for r in warm)
        typical = min(warm, key=lambda r: (abs(r.total_ms - median), r.start_ns))
        add("slowest warm", slowest)
        if typical is not slowest:
            add("median warm", typical)
    if cold:
        add("cold", cold[0])
    return tuple(rows)


def _stage_series(
    names: Sequence[str],
    warm: Sequence[Request],
    cold: Sequence[Request],
    base_warm: Sequence[Request] | None,
    comparison: Mapping[str, Any] | None,
) -> tuple[StageSeries, ...]:
    compared = comparison.get("stages", {}) if comparison else {}
    out = []
    for name in names:
        values = tuple(r.stages_ms[name] for r in warm if name in r.stages_ms)
        before = tuple(r.stages_ms[name] for r in base_warm or () if name in r.stages_ms)
        change = compared.get(name) or {}
        pct = change.get("change_pct")
        significant = change.get("significant")
        out.append(StageSeries(
            name=name,
            warm_ms=values,
            warm=_dist(values),
            cold_ms=tuple(r.stages_ms[name] for r in cold if name in r.stages_ms),
            baseline_ms=before,
            baseline=_dist(before),
            change_pct=float(pct) if isinstance(pct, (int, float)) else None,
            significant=significant if isinstance(significant, bool) else None,
        ))
    return tuple(out)


def _cohorts(
    warm: Sequence[Request], contract: Sequence[Mapping[str, Any]] | None
) -> tuple[CohortSeries, ...]:
    groups: dict[str, list[Request]] = defaultdict(list)
    for req in warm:
        key = cohort_key(req)
        if key is not None:
            groups[key].append(req)
    if contract:
        order = [str(c.get("key")) for c in contract if str(c.get("key")) in groups]
        verdicts = {str(c.get("key")): c.get("verdict") or {} for c in contract}
    else:
        order = sorted(groups, key=lambda k: (-len(groups[k]), k))
        verdicts = {}
    out = []
    for key in order:
        reqs = groups[key]
        totals = tuple(r.total_ms for r in reqs)
        per_stage: dict[str, list[float]] = defaultdict(list)
        for r in reqs:
            for name, ms in r.stages_ms.items():
                per_stage[name].append(ms)
        v = verdicts.get(key, {})
        out.append(CohortSeries(
            key=key,
            totals_ms=totals,
            total=distribution(totals),
            stage_medians_ms={n: statistics.median(per_stage[n]) for n in order_stages(per_stage)},
            cause=v.get("cause"),
            stage=v.get("stage"),
        ))
    return tuple(out)


def _gpu(points: Sequence[MetricPoint], origin_ns: int, lo_ns: int, hi_ns: int) -> tuple[GpuSeries, ...]:
    util: dict[str, list[tuple[int, float]]] = defaultdict(list)
    used: dict[str, list[tuple[int, float]]] = defaultdict(list)
    limit: dict[str, float] = {}
    model: dict[str, str] = {}
    for p in points:
        if not lo_ns <= p.time_ns <= hi_ns:
            continue
        hw_id = str(p.attributes.get(semconv.HW_ID, ""))
        if p.name == semconv.HW_GPU_UTILIZATION:
            util[hw_id].append((p.time_ns, p.value))
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
        scale = 100.0 if samples and max(v for _, v in samples) > PERCENT_GUESS else 1.0
        out.append(GpuSeries(
            hw_id=hw_id,
            model=model.get(hw_id),
            utilization=tuple(((t - origin_ns) / 1e9, v / scale) for t, v in samples),
            memory_used_bytes=tuple(((t - origin_ns) / 1e9, v) for t, v in sorted(used.get(hw_id, []))),
            memory_limit_bytes=limit.get(hw_id),
        ))
    return tuple(out)


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
    requests = find_requests(recording.spans)
    warm = [r for r in requests if not r.cold and not r.error]
    cold = [r for r in requests if r.cold]
    base_warm = None
    if baseline is not None:
        base_warm = [r for r in find_requests(baseline.spans) if not r.cold and not r.error]
    names = order_stages({n for r in [*warm, *cold, *(base_warm or [])] for n in r.stages_ms})
    comparison = contract.get("comparison")
    comparison = comparison if isinstance(comparison, dict) else None

    origin = min((r.start_ns for r in requests), default=0)
    end = max((r.start_ns + int(r.total_ms * 1e6) for r in requests), default=origin)
    pad = max(int(GPU_PAD_S * 1e9), int((end - origin) * GPU_PAD_FRACTION))
    windows = sorted({
        ((s - origin) / 1e9, (e - origin) / 1e9)
        for r in requests for s, e in r.stage_windows_ns(semconv.STAGE_FORWARD)
    })
    counts = contract.get("counts")
    if not isinstance(counts, dict):
        counts = {"warm": len(warm), "cold": len(cold),
                  "failed": sum(1 for r in requests if r.error and not r.cold)}
    counts = {"requests": len(requests), **{str(k): int(v) for k, v in counts.items()}}
    cohorts = contract.get("cohorts")
    return ReportCharts(
        title=title,
        origin_unix_ns=origin,
        counts=counts,
        verdict=dict(verdict) if isinstance(verdict := contract.get("verdict"), dict) else {},
        stages=_stage_series(names, warm, cold, base_warm, comparison),
        cohorts=_cohorts(warm, cohorts if isinstance(cohorts, list) else None),
        waterfall=_waterfall(warm, cold),
        images=tuple(
            ImagePoint(r.trace_id, r.image_width, r.image_height, r.image_bytes,
                       r.stages_ms.get(semconv.STAGE_DECODE), r.stages_ms.get(semconv.STAGE_RESIZE),
                       r.cold)
            for r in requests
            if not r.error and (r.pixels is not None or r.image_bytes is not None)
        ),
        gpu=_gpu(recording.metrics, origin, origin - pad, end + pad) if requests else (),
        forward_windows_s=tuple(windows),
        comparison=tuple(str(s) for s in (comparison or {}).get("summary", [])),
        has_baseline=baseline is not None,
        problems=tuple(str(p) for p in problems) if isinstance(
            problems := contract.get("problems"), list) else (),
    )
