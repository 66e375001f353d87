"""A recording -> requests -> warm-run figures -> verdict (-> comparison). Pure (no I/O).

Steps of :func:`diagnose`:

1. :func:`~otel_stages.analysis.screen.screen_spans` leaves out spans with impossible times.
2. :func:`~otel_stages.analysis.requests.group_spans` builds requests and counts incomplete ones.
3. ``last_run``: keep only the newest process's requests (every run read is still listed).
4. Split: failed (error), cold (first request of a process), set apart (first of a new input, or
   after an idle gap, the warm-up after a cold request, when they stand out;
   :func:`~otel_stages.analysis.cohorts.find_set_apart`),
   warm (the rest).
5. Warm-run statistics and GPU evidence become :class:`~otel_stages.analysis.figures.Figures`,
   overall and per input cohort, and :func:`~otel_stages.analysis.decision.decide` gives the
   verdicts.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from otel_stages import semconv
from otel_stages.analysis.batching import BatchSummary, summarize_batches
from otel_stages.analysis.calls import remote_calls
from otel_stages.analysis.caveats import BEFORE_PERCENTILE, OUTLIVED_PERCENTILE
from otel_stages.analysis.cohorts import (
    CohortKeys,
    SetApart,
    cold_figures,
    failed_cold_paid,
    group,
    set_apart_and_warmup,
    stopped_in,
)
from otel_stages.analysis.compact import paused_gc
from otel_stages.analysis.comparison import compare
from otel_stages.analysis.decision import MIN_WARM_RUNS, decide, verdict_band_ms
from otel_stages.analysis.episode import Episode, bucket_counts, buckets, confirm, find_episode
from otel_stages.analysis.evidence import stage_evidence
from otel_stages.analysis.failures import KIND_UNKNOWN, failures_to_dict
from otel_stages.analysis.figures import (
    CohortFigures,
    CohortVerdict,
    ColdFigures,
    Figures,
    StageFigures,
    TotalFigures,
    UnaccountedFigures,
    WarmupFigures,
    reference_ms,
    share_tentative,
)
from otel_stages.analysis.gpu import (
    GpuEvidence,
    SpanUnits,
    gpu_evidence,
    misaligned_processes,
    model_gpus,
    span_units,
    with_unread,
)
from otel_stages.analysis.gpu_owners import (
    ambiguous_series,
    ambiguous_unit_lines,
    forward_owners,
    shared_hw_id_lines,
    shared_hw_ids,
    unplaced_lines,
    unplaced_senders,
)
from otel_stages.analysis.mechanisms import stage_signals, with_mechanisms
from otel_stages.analysis.model import MetricPoint, Recording
from otel_stages.analysis.noise import noise_band
from otel_stages.analysis.process_mix import process_mix
from otel_stages.analysis.report import DEFAULT_TOP, Counts, Report, RequestSets, Run, SlowRequest
from otel_stages.analysis.requests import Request, attribute_text, group_spans, process_keys
from otel_stages.analysis.sampled import seq_coverage
from otel_stages.analysis.screen import screen_spans
from otel_stages.analysis.signal_figures import StageSignals
from otel_stages.analysis.span_issues import OVERLAP_TOLERANCE_MS
from otel_stages.analysis.stage_map_checks import said_by_a_map
from otel_stages.analysis.stage_overlap import overlap_caveat, overlap_stats
from otel_stages.analysis.stage_signals import (
    PressureSeries,
    SignalTable,
    ThrottleSeries,
    signal_table,
)
from otel_stages.analysis.stats import (
    Distribution,
    StageStats,
    Unaccounted,
    distribution,
    order_stages,
    percentile,
    stage_stats,
    unaccounted_stats,
    variance_explained_by_groups,
)
from otel_stages.analysis.value_issues import unread_values

#: Verdicts are worked out for at most this many cohorts (the largest); the rest are listed only.
MAX_COHORT_VERDICTS = 10
#: ``Report.cohort_counts`` key for warm requests whose input is unknown.
UNKNOWN_INPUT = "unknown"


@dataclass
class _Warm:
    """Warm-run statistics and the figures built from them."""

    stages: dict[str, StageStats]
    total: Distribution | None
    unaccounted: Unaccounted | None
    gpu: GpuEvidence
    cold: ColdFigures | None
    figures: Figures
    signals: dict[str, StageSignals]


def stage_figures(s: StageStats) -> StageFigures:
    """Trace statistics -> the rules' input (all fields known)."""
    return StageFigures(
        name=s.name, count=s.count, median_ms=s.median_ms, swing_ms=s.swing_ms, share=s.share,
        p5_ms=s.p5_ms, p95_ms=s.p95_ms, min_ms=s.min_ms, max_ms=s.max_ms, mean_ms=s.mean_ms,
        spike_ms=s.spike_ms, explains=s.explains, alone=s.alone,
    )


def total_figures(t: Distribution) -> TotalFigures:
    """Request-total statistics -> the rules' input."""
    return TotalFigures(count=t.count, median_ms=t.median_ms, swing_ms=t.swing_ms, p5_ms=t.p5_ms,
                        p95_ms=t.p95_ms, min_ms=t.min_ms, max_ms=t.max_ms, spike_ms=t.spike_ms)


def failure_kinds(failed: Sequence[Request]) -> tuple[dict[str, int], dict[str, int]]:
    """Failed requests by error kind (:attr:`Request.error_type
    <otel_stages.analysis.requests.Request.error_type>`, else
    :data:`~otel_stages.analysis.failures.KIND_UNKNOWN`) and by where they stopped (``failed in
    decode`` for a failed stage span, else ``last stage <name>``)."""
    kinds: dict[str, int] = defaultdict(int)
    where: dict[str, int] = defaultdict(int)
    for r in failed:
        kinds[r.error_type or KIND_UNKNOWN] += 1
        stop = stopped_in(r)
        if stop is not None:
            where[f"{'failed in' if stop[1] else 'last stage'} {stop[0]}"] += 1
    return dict(kinds), dict(where)


def failed_times(failed: Sequence[Request]) -> tuple[float | None, dict[str, float]]:
    """The failed requests' median total (ms; ``None`` without any) and each stage's median
    over them (ms; 0 in a failed request without that stage), in pipeline order: where the time
    of the requests that failed went (:func:`~otel_stages.analysis.failures.failures_slow`)."""
    if not failed:
        return None, {}
    names = order_stages({n for r in failed for n in r.stages_ms})
    return (percentile([r.total_ms for r in failed], 50),
            {n: percentile([r.stages_ms.get(n, 0.0) for r in failed], 50) for n in names})


def _with_batches(figures: Figures, batches: BatchSummary | None) -> Figures:
    """``figures`` with ``batch_fill_ms`` / ``batch_wait_ms``, the medians of ``batches``, and
    their p95s (``batch_fill_p95_ms`` / ``batch_wait_p95_ms``; all left
    ``None`` without batch spans or their members' queue spans, and when executors overlap: fill
    then runs from the first enqueue, so it cannot tell waiting for a batch to fill from waiting
    for a free executor)."""
    if batches is None or not batches.fill_ms or not batches.wait_ms or batches.overlapping_executors:
        return figures
    return replace(figures, batch_fill_ms=percentile(batches.fill_ms, 50),
                   batch_wait_ms=percentile(batches.wait_ms, 50),
                   batch_fill_p95_ms=percentile(batches.fill_ms, 95),
                   batch_wait_p95_ms=percentile(batches.wait_ms, 95))


def _warm(
    warm: Sequence[Request], cold: Sequence[Request], metrics: Sequence[MetricPoint], keys: CohortKeys,
    *, cohorts: Sequence[CohortFigures] = (), mix: float | None = None,
    failed: Sequence[Request] = (), requests: int = 0, apart: Sequence[SetApart] = (),
    warmup: WarmupFigures | None = None,
    cold_first: bool = True, detached_requests: int = 0, clash_spans: int = 0,
    table: SignalTable | None = None,
    verdict_only: bool = False,
    unread_forwards: int = 0,
    misaligned: int | None = None,
    aside: Sequence[Request] = (),
    processes: frozenset[str] | None = None,
    models: Mapping[str, frozenset[str]] | None = None,
    units: SpanUnits | None = None,
) -> _Warm:
    """The figures of ``warm``; ``table``: their signal table when the caller has it (a cohort's
    is a subset of all warm requests' table: each request's spans are read once).

    ``verdict_only``: figures for what a cohort keeps of its verdict (:class:`CohortVerdict`:
    cause, stage, tentative). The per-request stage evidence (:func:`stage_evidence`: size and
    attribute correlations, the preprocess facts) is then left out: the rules read it only for the
    verdict's evidence sentences and advice (``decision._warm_verdict``; the cause comes from the
    mechanisms, which stay), and a fleet's cohorts would read every warm request again.

    ``processes``: the process keys of every request read (the GPU points of other processes are
    lined up with every process's forwards; :mod:`otel_stages.analysis.gpu_owners`). ``models``:
    each process's model GPU over the whole window (:func:`~otel_stages.analysis.gpu.model_gpus`:
    a cohort's memory rule reads the GPU the window's utilization chose). ``unread_forwards``:
    warm forward spans whose ``gpu.utilization.mean`` is no reading, said when the GPU evidence
    makes no call (:func:`~otel_stages.analysis.gpu.with_unread`). ``units``: the unit of each
    process's forward-span readings over all warm requests
    (:func:`~otel_stages.analysis.gpu.span_units`; default: over ``warm``). ``misaligned``: for a
    cohort, the whole window's :func:`~otel_stages.analysis.gpu.misaligned_processes`;
    ``aside``: the requests read that are not warm (their forwards' GPU readings are not between
    the forwards: :func:`~otel_stages.analysis.gpu.falls`)."""
    totals = [r.total_ms for r in warm]
    stages = stage_stats([r.stages_ms for r in warm], totals)
    total = distribution(totals) if totals else None
    gap = unaccounted_stats([r.unaccounted_ms for r in warm], totals)
    if len(warm) < MIN_WARM_RUNS:  # a covariance of a handful of points is noise: not shown
        stages = {n: replace(s, explains=None) for n, s in stages.items()}
        gap = None if gap is None else replace(gap, explains=None)
    figs = {n: stage_figures(s) for n, s in stages.items()}
    total_fig = None if total is None else total_figures(total)
    # the slow forwards the GPU rules judge are those beyond the band the verdict uses
    band = noise_band(figs.values(), reference_ms(figs, total_fig)).band_ms if figs else None
    gpu = gpu_evidence(warm, metrics, processes, band_ms=band, units=units, misaligned=misaligned,
                       aside=aside)
    gpu = with_unread(gpu, unread_forwards)
    # CPU, GC, loop, throttling, memory
    signals = stage_signals(warm, list(stages), metrics, gpu, table=table, processes=processes,
                            band_ms=band or 0.0, model_gpus=models)
    cold_fig = cold_figures(cold, warm, keys, first_of_process=cold_first)
    kinds, where = failure_kinds(failed)
    failed_total, failed_stages = failed_times(failed)
    figures = Figures(
        warm_requests=len(warm),
        stages=figs,
        total=total_fig,
        gpu=gpu,
        unaccounted=None if gap is None else UnaccountedFigures(
            gap.median_ms, gap.swing_ms, gap.share, gap.explains, gap.alone),
        cold=cold_fig,
        cohorts=cohorts,
        input_mix_explains=mix,
        process_mix=None if verdict_only else process_mix(warm),
        stage_evidence=with_mechanisms({} if verdict_only else stage_evidence(warm, list(stages)),
                                       signals),
        failed_requests=len(failed),
        failed_cold=sum(1 for r in failed if r.cold),
        requests=requests,
        failure_kinds=kinds,
        failure_stages=where,
        failed_median_total_ms=failed_total,
        failed_stages_ms=failed_stages,
        set_apart=tuple(a.figures() for a in apart),
        warmup=warmup,
        per_request=True,
        detached_requests=detached_requests,
        # (a cohort's verdict keeps only cause, stage and tentative: the caveat is the whole run's)
        outlived_requests=0 if verdict_only else sum(
            1 for r in warm if r.after_ms > OVERLAP_TOLERANCE_MS),
        outlived_p95_ms=None if verdict_only or not warm else percentile(
            [r.after_ms for r in warm], OUTLIVED_PERCENTILE),
        before_requests=0 if verdict_only else sum(
            1 for r in warm if r.before_ms > OVERLAP_TOLERANCE_MS),
        before_p95_ms=None if verdict_only or not warm else percentile(
            [r.before_ms for r in warm], BEFORE_PERCENTILE),
        clash_spans=clash_spans,
        services=() if verdict_only else services_of([*warm, *cold]),
        service_requests=0 if verdict_only else len(warm) + len(cold),
        episode=None if verdict_only or total_fig is None or band is None else _episode(
            warm, total_fig.median_ms, band),
    )
    return _Warm(stages, total, gap, gpu, cold_fig, figures, signals)


def _episode(warm: Sequence[Request], median_ms: float, band_ms: float) -> Episode | None:
    """The stretch of the run holding the warm requests slower than the median total plus the
    verdict's band, if they fall in one and the rest are steady
    (:mod:`otel_stages.analysis.episode`)."""
    slow_min = median_ms + band_ms
    procs = process_keys(warm)
    for per_process in (False, True):  # the recording's time, else each process's run
        at = buckets([r.start_ns for r in warm], procs if per_process else [""] * len(warm))
        e = find_episode(*bucket_counts(at, [r.total_ms for r in warm], slow_min), slow_min)
        if e is None:
            continue
        outside = [r.total_ms for r, b in zip(warm, at) if not e.holds(b)]
        held = [(r, p) for r, b, p in zip(warm, at, procs) if e.holds(b) and r.total_ms > slow_min]
        ran_in = {p for _, p in held}
        found = confirm(
            e, percentile(outside, 95) - percentile(outside, 5) if outside else None, band_ms,
            start_ns=min(r.start_ns for r, _ in held), end_ns=max(r.start_ns for r, _ in held),
            process=next(iter(ran_in)) if len(ran_in) == 1 and len(set(procs)) > 1 else "",
            per_process=per_process)
        if found is not None:
            return found
    return None


def services_of(requests: Sequence[Request]) -> tuple[tuple[str, int], ...]:
    """Requests per ``service.name`` of their resource (``""`` when unset), most first (ties by
    name), for :func:`~otel_stages.analysis.caveats.services_caveat`."""
    by_resource = Counter(id(r.resource) for r in requests)
    resources = {id(r.resource): r.resource for r in requests}
    counts: Counter[str] = Counter()
    for key, n in by_resource.items():
        name = resources[key].get(semconv.SERVICE_NAME)
        counts[name if isinstance(name, str) else ""] += n
    return tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _cohorts(
    warm: Sequence[Request], cold: Sequence[Request], metrics: Sequence[MetricPoint], keys: CohortKeys,
    table: SignalTable, processes: frozenset[str] | None = None,
    models: Mapping[str, frozenset[str]] | None = None, units: SpanUnits | None = None,
    aside: Sequence[Request] = (),
) -> tuple[list[CohortFigures], float | None]:
    """Cohorts of the warm requests (largest first) with their verdicts, and the input mix's part
    of the total's variance. ``table``: the signal table of ``warm``."""
    groups = group(warm, keys)
    position = {id(r): i for i, r in enumerate(warm)}
    # the readings' clock is the run's: judged once over the whole window (against the others'
    # forwards a cohort's would fall by the others' load)
    misaligned = (misaligned_processes(warm, metrics, processes, aside) if len(groups) > 1
                  else None)
    out = []
    for i, (key, reqs) in enumerate(groups.items()):
        totals = [r.total_ms for r in reqs]
        verdict = None
        if i < MAX_COHORT_VERDICTS and len(reqs) >= MIN_WARM_RUNS:
            own_cold = [c for c in cold if keys.key(c) == key]
            positions = [position[id(r)] for r in reqs]  # in order: a cohort keeps warm's
            v = decide(_warm(reqs, own_cold, metrics, keys, table=table.subset(positions),
                             verdict_only=True, processes=processes, models=models,
                             units=units, misaligned=misaligned).figures)
            verdict = CohortVerdict(v.cause, v.stage, v.tentative)
        out.append(CohortFigures(key, len(reqs), percentile(totals, 50), percentile(totals, 95), verdict))
    mix = variance_explained_by_groups([[r.total_ms for r in reqs] for reqs in groups.values()])
    return out, mix


def _cold_are_first(requests: Sequence[Request]) -> bool:
    """Whether every cold request is the earliest request of its process (``request.cold_start``
    can mark a later one: a model reload)."""
    first: dict[str, Request] = {}
    keys = process_keys(requests)
    for r, key in zip(requests, keys):
        if key not in first or r.start_ns < first[key].start_ns:
            first[key] = r
    return all(first[key] is r for r, key in zip(requests, keys) if r.cold)


def runs_of(requests: Sequence[Request]) -> list[Run]:
    """One :class:`Run` per process, by first request start."""
    found: dict[str, list[Request]] = defaultdict(list)
    for r, key in zip(requests, process_keys(requests)):
        found[key].append(r)
    runs = []
    for key, reqs in found.items():
        resource = reqs[0].resource
        name, instance = resource.get(semconv.SERVICE_NAME), resource.get(semconv.SERVICE_INSTANCE_ID)
        host = resource.get(semconv.HOST_NAME)
        pid = resource.get(semconv.PROCESS_PID) if instance in (None, "") else None
        runs.append(Run(
            key=key,
            service_name=None if name in (None, "") else attribute_text(name),
            service_instance_id=None if instance in (None, "") else attribute_text(instance),
            first_unix_ns=min(r.start_ns for r in reqs),
            last_unix_ns=max(r.end_ns for r in reqs),
            requests=len(reqs),
            host_name=None if host in (None, "") else attribute_text(host),
            process_pid=None if pid in (None, "") else attribute_text(pid),
        ))
    return sorted(runs, key=lambda r: (r.first_unix_ns, r.key))


def _groups(requests: list[Request]) -> dict[str, list[str]]:
    found: dict[str, set[str]] = {}
    for req in requests:
        for grp in req.groups:
            found.setdefault(grp.name, set()).update(
                s.name for s in (*req.spans, *req.groups)
                if s.parent_span_id == grp.span_id and s.trace_id == grp.trace_id
            )
    return {name: order_stages(kids) for name, kids in sorted(found.items())}


def diagnose(
    recording: Recording, *, baseline: Recording | None = None, top: int = DEFAULT_TOP,
    last_run: bool = False,
) -> Report:
    """Diagnose ``recording`` (module docstring). ``baseline`` (the same inputs before a change)
    fills ``comparison``; its problems are added prefixed with ``baseline:``. ``top`` is how many
    slowest warm requests to list. ``last_run``: only the newest process (by first request), for
    the recording and the baseline alike. Pure; never raises for odd input (an empty recording
    gives a report with ``requests == 0`` and ``verdict.cause is None``).
    """
    with paused_gc():
        return _diagnose(recording, baseline=baseline, top=top, last_run=last_run)


def _diagnose(recording: Recording, *, baseline: Recording | None, top: int, last_run: bool) -> Report:
    screened = screen_spans(recording.spans)
    grouping = group_spans(screened.spans)
    requests, incomplete = grouping.requests, grouping.incomplete
    runs = runs_of(requests)
    if last_run and runs:
        newest = max(runs, key=lambda r: (r.first_unix_ns, r.key))
        requests = [r for r, key in zip(requests, process_keys(requests)) if key == newest.key]
        incomplete = [u for u in incomplete if u.process == newest.key]
        runs = [replace(r, reported=r.key == newest.key) for r in runs]
    keys = CohortKeys(requests)
    failed = [r for r in requests if r.error]
    cold = [r for r in requests if r.cold and not r.error]
    apart, warmup = set_apart_and_warmup(requests, keys)
    apart_ids = {id(a.request) for a in apart}
    warm = [r for r in requests if not r.cold and not r.error and id(r) not in apart_ids]
    counted_cold = len(cold)
    # a cold request that failed after paying the cold start is the cold start's figures (their
    # times a lower bound); left out, the report read "stable, 0 cold" after a 2.5 s model load
    paid = {id(r) for r in failed_cold_paid([r for r in requests if r.cold], warm, keys)}
    cold = [r for r in requests if r.cold and (not r.error or id(r) in paid)]
    # every warm request's spans read once for the signals; the cohorts take their rows
    table = signal_table(warm, None, ThrottleSeries(recording.metrics),
                         PressureSeries(recording.metrics))
    processes = frozenset(process_keys(requests))
    # the model's GPU per process, chosen once over the window: every cohort reads its memory
    # (only with memory limits: without, the memory rule reads nothing)
    models = (model_gpus(warm, recording.metrics, processes)
              if any(p.name == semconv.HW_GPU_MEMORY_LIMIT for p in recording.metrics) else {})
    # each process's unit of its forward spans' GPU readings, over all its warm forwards
    units = span_units(warm)
    # the requests read that are not warm: their forwards are neither warm nor between forwards
    warm_ids = {id(r) for r in warm}
    aside = [r for r in requests if id(r) not in warm_ids]
    cohorts, mix = _cohorts(warm, cold, recording.metrics, keys, table, processes, models, units,
                            aside)
    unread = unread_values(requests)
    result = _warm(warm, cold, recording.metrics, keys, cohorts=cohorts, mix=mix,
                   failed=failed, requests=len(requests), apart=apart, warmup=warmup,
                   cold_first=_cold_are_first(requests),
                   detached_requests=min(grouping.detached_requests, len(requests)),
                   clash_spans=grouping.clashes.count, table=table, processes=processes,
                   models=models, units=units, aside=aside,
                   # (the warm ones walked again only when some forward's value is unusable);
                   # readings of a process that mixes units are unusable too
                   unread_forwards=units.mixed_forwards + (
                       unread.gpu_utilization and unread_values(warm).gpu_utilization))
    batches = summarize_batches(screened.spans, {(r.trace_id, r.span_id) for r in requests
                                                 if r.cold or id(r) in apart_ids})
    # the request.seq gaps are of every request read (warm, cold, failed)
    figures = replace(result.figures, sampling=seq_coverage(requests, warm),
                      calls=remote_calls(requests, screened.spans,
                                         {(r.trace_id, r.span_id) for r in requests
                                          if not r.cold and id(r) not in apart_ids}),
                      calls_left_out=tuple(recording.calls_left_out))
    verdict = decide(_with_batches(figures, batches))
    overlap = overlap_stats(warm, with_explains=len(warm) >= MIN_WARM_RUNS)
    overlap_caveat(verdict, result.figures, overlap)
    problems = [*recording.problems, *screened.problems, *grouping.problems, *unread.problems(),
                *units.problems()]
    if (screened.spans and not requests and not incomplete  # (all left out: said above)
            and not said_by_a_map(recording.problems)):  # the map's lines say which entry failed
        problems.append(
            f"{len(screened.spans)} spans read but none is a stage span (expected spans named"
            " download/decode/resize/queue/forward, or children of a 'request' span)"
        )
    problems += shared_hw_id_lines(shared_hw_ids(recording.metrics, processes))
    problems += ambiguous_unit_lines(ambiguous_series(recording.metrics))
    # a GPU worker that recorded forwards under other processes' requests places its own points
    placed = forward_owners(requests, recording.metrics, processes)
    unplaced = unplaced_senders(recording.metrics, placed.owners, placed.hosts)
    problems += unplaced_lines(len(unplaced), unplaced[0][0] if unplaced else "")
    counts: dict[str, int] = defaultdict(int)
    for key in keys.keys(warm):
        counts[key or UNKNOWN_INPUT] += 1
    report = Report(
        requests=len(requests),
        counts=Counts(warm=len(warm), cold=counted_cold + len(apart), failed=len(failed),
                      incomplete=len(incomplete), cold_failed=sum(1 for r in failed if r.cold)),
        stages=result.stages,
        total=result.total,
        unaccounted=result.unaccounted,
        overlap=overlap,
        cold_start=result.cold,
        verdict=verdict,
        gpu=result.gpu,
        cohorts=share_tentative(cohorts, verdict.tentative),
        input_mix_explains=mix,
        process_mix=result.figures.process_mix,
        sampling=figures.sampling,
        set_apart=apart,
        failures=failures_to_dict(result.figures, verdict_band_ms(result.figures)),
        episode=result.figures.episode,
        runs=runs,
        noise=(noise_band(result.figures.stages.values(), result.figures.reference_ms)
               if warm else None),
        slowest=[SlowRequest.of(r) for r in sorted(warm, key=lambda r: -r.total_ms)[: max(top, 0)]],
        problems=problems,
        groups=_groups(requests),
        total_samples=[r.total_ms for r in warm],
        stage_samples={n: [r.stages_ms[n] for r in warm if n in r.stages_ms] for n in result.stages},
        cohort_counts=dict(counts),
        batches=batches,
        request_sets=RequestSets(tuple(warm), tuple(cold), tuple(a.request for a in apart),
                                 tuple(failed), keys),
        signals=result.signals,
    )
    if baseline is not None:
        before = diagnose(baseline, top=top, last_run=last_run)
        report.problems.extend(f"baseline: {p}" for p in before.problems)
        report.comparison = compare(before, report)
        report.baseline_sets = before.request_sets
    return report
