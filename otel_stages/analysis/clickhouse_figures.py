"""ClickHouse aggregates -> the rules' input -> the verdict. Pure (no engine).

:func:`figures` turns :class:`~otel_stages.analysis.clickhouse_result.FleetAggregates` (what the
SQL computed over warm requests) into :class:`~otel_stages.analysis.figures.Figures`, and
:func:`verdict` hands them to :func:`otel_stages.analysis.decision.decide`, the one rule set every
source uses: no rule is repeated here or in SQL. The same is done within each input cohort
(:func:`cohort_figures`), as :func:`otel_stages.analysis.diagnosis.diagnose` does.

Mapping (units as in :mod:`otel_stages.analysis.figures`):

- stage ``share`` = ``sum(stage ms) / sum(total ms)`` (``StageAggregate.share_of_time``),
  ``explains`` = ``cov(stage, total) / var(total)``, ``spike_ms`` = ``max(max - median,
  median - min)``; the request total and the unaccounted gap likewise;
- cold request: compared with the warm requests of its input when every cold request's input has
  at least :data:`~otel_stages.analysis.cohorts.COMPARABLE_MIN_REQUESTS` of them, else with all
  warm requests (:func:`otel_stages.analysis.cohorts.cold_figures`);
- GPU: the engine's utilization during warm forwards, split at the slow-forward threshold (the
  warm forward median plus the noise band of :func:`band_ms`, passed to the SQL), judged as the
  trace report judges it (:func:`otel_stages.analysis.gpu.evidence_of`); within each cohort the
  same over its own forwards, split at its own forward median plus its own noise band;
- per-stage evidence: does the stage follow image pixels / bytes (Pearson r computed in SQL) and
  the per-size medians, with the sentences of :mod:`otel_stages.analysis.evidence`.

- decode / resize evidence also carries the decode facts behind the concrete preprocessing advice
  (:mod:`otel_stages.analysis.clickhouse_preprocess`).

- mechanisms: the per-stage signal aggregates of
  :mod:`otel_stages.analysis.clickhouse_signals` (CPU, wait, GC, event-loop lag, cgroup
  throttling, loop holders; GPU memory around forwards) through
  :func:`otel_stages.analysis.mechanisms.judge` and
  :func:`otel_stages.analysis.gpu_memory.memory_mechanism`, over all warm requests and within each
  cohort, into the evidence as :func:`otel_stages.analysis.mechanisms.with_mechanisms` puts them.

- data problems (:mod:`otel_stages.analysis.clickhouse_issues`): ``Figures.detached_requests``
  (clock skew: the SYNC_CLOCKS advice), spans left out per reason, stage spans outside or
  overlapping, span-id clashes; failed requests' kinds and where they stopped
  (:mod:`otel_stages.analysis.clickhouse_failures`); ``per_request`` (stage counts are requests,
  so a stage in few requests is named).

Not computed in SQL yet (documented gaps, not guesses; the first said in ``problems`` with
:data:`~otel_stages.analysis.clickhouse_issues.NOT_CHECKED` when it could change the answer):
signals of stage spans inside custom group spans, and throttling on stage spans without other
signals (counted as not recorded); the prompt-length part of cohort keys (also in the requests set
apart as cold, :mod:`otel_stages.analysis.clickhouse_apart`, whose inputs are image size and
format); with cold
requests of several inputs, the comparison is with all warm requests; a cold request's input known
from its prompt length alone (the SQL reads image sizes only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from otel_stages import semconv
from otel_stages.analysis.clickhouse_gaps import gaps_caveat
from otel_stages.analysis.clickhouse_issues import NOT_CHECKED
from otel_stages.analysis.clickhouse_result import (
    CohortAggregate,
    ColdInput,
    FleetAggregates,
    GpuAggregate,
    StageAggregate,
    Summary,
    alone_of,
    ordered_stages,
)
from otel_stages.analysis.cohorts import COMPARABLE_MIN_REQUESTS
from otel_stages.analysis.decision import COLD_START_MIN_RATIO, MIN_WARM_RUNS, decide, verdict_band_ms
from otel_stages.analysis.evidence import FOLLOWS_SIZE_MIN_R, other_images, sized_evidence
from otel_stages.analysis.failures import failures_to_dict
from otel_stages.analysis.figures import (
    ALL_WARM,
    COLD_UNTRACED,
    SAME_INPUT,
    CohortFigures,
    CohortVerdict,
    ColdFigures,
    Figures,
    PreprocessFacts,
    StageEvidence,
    StageFigures,
    TotalFigures,
    UnaccountedFigures,
    reference_ms,
    share_tentative,
)
from otel_stages.analysis.gpu import LEVEL_NONE, GpuEvidence, evidence_of, with_unread
from otel_stages.analysis.gpu_memory import memory_mechanism
from otel_stages.analysis.mechanisms import judge, with_mechanisms
from otel_stages.analysis.noise import noise_band
from otel_stages.analysis.preprocessing import evidence_lines as preprocess_lines
from otel_stages.analysis.report import cohort_to_dict, cold_to_dict, noise_to_dict
from otel_stages.analysis.signal_figures import StageSignals
from otel_stages.analysis.stage_overlap import overlap_caveat
from otel_stages.analysis.stats import Distribution, StageStats, Unaccounted
from otel_stages.analysis.verdict import Verdict
from otel_stages.analysis.window_edge import window_caveat

#: Verdicts are worked out for at most this many cohorts (as in the trace report).
MAX_COHORT_VERDICTS = 10


def _spike(s: Summary) -> float:
    return max(s.max_ms - s.median_ms, s.median_ms - s.min_ms)


def stage_figures(s: StageAggregate) -> StageFigures:
    """One stage's aggregates -> the rules' input (every field known)."""
    r = s.ran
    return StageFigures(
        name=s.name, count=r.count, median_ms=r.median_ms, swing_ms=r.swing_ms,
        share=s.share_of_time, p5_ms=r.p5_ms, p95_ms=r.p95_ms, min_ms=r.min_ms, max_ms=r.max_ms,
        mean_ms=r.mean_ms, spike_ms=_spike(r), explains=s.explained, alone=s.alone,
    )


def total_figures(t: Summary) -> TotalFigures:
    """The request total's distribution -> the rules' input."""
    return TotalFigures(count=t.count, median_ms=t.median_ms, swing_ms=t.swing_ms, p5_ms=t.p5_ms,
                        p95_ms=t.p95_ms, min_ms=t.min_ms, max_ms=t.max_ms, spike_ms=_spike(t))


def gpu_evidence(g: GpuAggregate) -> GpuEvidence:
    """The engine's GPU aggregate judged as the trace report judges it
    (:func:`otel_stages.analysis.gpu.evidence_of`: the slow forwards' level, else all forwards')."""
    if g.source is None:
        return GpuEvidence(level=LEVEL_NONE, forwards=g.forwards if g.forwards else 0,
                           unread_forwards=g.unread_forwards)
    return with_unread(evidence_of(source=g.source, forwards=g.forwards, covered=g.forwards_covered,
                                   samples=g.samples, total=g.sum_utilization, split=g.split,
                                   slow_min_ms=g.slow_min_ms, hw_id=g.hw_id,
                                   unidentified_processes=g.unidentified_processes,
                                   unidentified_gpus=g.unidentified_gpus,
                                   misaligned_processes=g.misaligned_processes,
                                   misaligned_means=g.misaligned_means), g.unread_forwards)


def band_ms(stages: Mapping[str, StageAggregate], total: Summary | None) -> float | None:
    """The run's noise band (ms) for ``stages`` and ``total`` (all warm requests, or a cohort's):
    the band :func:`~otel_stages.analysis.decision.decide` uses, which sets the slow forwards of
    the GPU rules; ``None`` without stages."""
    if not stages:
        return None
    figs = {n: stage_figures(s) for n, s in stages.items()}
    return noise_band(figs.values(), reference_ms(figs, None if total is None
                                                  else total_figures(total))).band_ms


def _size_evidence(stage: StageAggregate, sizes: Sequence[tuple[int, int, int, float]],
                   other_images: int = 0) -> StageEvidence:
    """:func:`otel_stages.analysis.evidence.sized_evidence` from SQL figures: the Pearson r
    against pixels / bytes and ``sizes`` = ``(width, height, requests, median ms)`` per input
    size where the stage ran."""
    known = [(what, r) for what, r in (("pixels", stage.pixels_correlation),
                                       ("bytes", stage.bytes_correlation)) if r is not None]
    unknown = max(0, stage.ran.count - sum(n for _, _, n, _ in sizes))
    return sized_evidence(stage.name, known, sizes, unknown, stage.ran.count, other_images)


def _follow_line(stage: str, what: str, r: float | None) -> tuple[str, ...]:
    """:func:`otel_stages.analysis.evidence.follow_evidence`'s sentence from an SQL r."""
    if r is None:
        return ()
    verb = "follows" if abs(r) >= FOLLOWS_SIZE_MIN_R else "does not follow"
    return (f"{stage} time {verb} {what} (r = {r:.2f})",)


def stage_evidence(stage: StageAggregate, sizes: Sequence[tuple[int, int, int, float]],
                   preprocess: PreprocessFacts | None = None) -> StageEvidence | None:
    """What :func:`otel_stages.analysis.evidence.stage_evidence` gives for this stage, from the
    SQL figures: size for decode / resize and a ``preprocess`` stage, image bytes for download,
    ``queue.depth`` for queue;
    ``None`` for the others (forward's evidence is the GPU's)."""
    if stage.name in (semconv.STAGE_DECODE, semconv.STAGE_RESIZE):
        size = _size_evidence(stage, sizes, other_images(preprocess) if preprocess else 0)
        if preprocess is None:
            return size
        return replace(size, lines=(*size.lines, *preprocess_lines(preprocess)),
                       preprocess=preprocess)
    if stage.name == semconv.STAGE_PREPROCESS:  # a stage map's (or a custom) preprocess: sizes only
        return _size_evidence(stage, sizes, 0)
    if stage.name == semconv.STAGE_DOWNLOAD:
        return StageEvidence(_follow_line(stage.name, "image bytes", stage.bytes_correlation))
    if stage.name == semconv.STAGE_QUEUE:
        r = stage.depth_correlation
        return StageEvidence(() if r is None else
                             (f"{stage.name} time vs {semconv.QUEUE_DEPTH}: r = {r:.2f}",))
    return None


def _evidence(stages: Mapping[str, StageAggregate],
              sizes: Callable[[str], Sequence[tuple[int, int, int, float]]],
              preprocess: PreprocessFacts | None = None) -> dict[str, StageEvidence]:
    out = {}
    for name, s in stages.items():
        found = stage_evidence(s, sizes(name), preprocess)
        if found is not None:
            out[name] = found
    return out


def _sizes(cohorts: Sequence[CohortAggregate], stage: str) -> list[tuple[int, int, int, float]]:
    """Per input size, the stage's request count and median (cohorts of one size only: with
    several formats of one size, the per-size median is not known and the size is left out)."""
    by_size: dict[tuple[int, int], list[CohortAggregate]] = {}
    for c in cohorts:
        if stage in c.stages:
            by_size.setdefault((c.width, c.height), []).append(c)
    out = []
    for (w, h), found in by_size.items():
        if len(found) == 1:
            ran = found[0].stages[stage].ran
            out.append((w, h, ran.count, ran.median_ms))
    return out


def stage_signals(agg: FleetAggregates, cohort: CohortAggregate | None = None
                  ) -> dict[str, StageSignals]:
    """The mechanism rules (:func:`otel_stages.analysis.mechanisms.judge`, and
    :func:`otel_stages.analysis.gpu_memory.memory_mechanism` for ``forward``) on the signals the
    engine computed over all warm requests, or within ``cohort``; stages without any recorded
    signal left out, as in the file report. Empty without signal aggregates."""
    key = (None, None, None) if cohort is None else (cohort.width, cohort.height, cohort.format)
    scope = next((s for s in agg.signals if (s.width, s.height, s.format) == key), None)
    if scope is None:
        return {}
    gpu: GpuEvidence | None
    if cohort is None:
        band, gpu = band_ms(agg.stages, agg.total), gpu_evidence(agg.gpu)
    else:
        band, gpu = band_ms(cohort.stages, cohort.total), _cohort_gpu(agg, cohort)
    memory_ev = (None if scope.memory is None
                 else replace(scope.memory, band_ms=band or 0.0))
    out = {}
    for name in ordered_stages(scope.stages):
        forward = name == semconv.STAGE_FORWARD
        memory = memory_mechanism(memory_ev) if forward else None
        judged = judge(scope.stages[name], scope.held, memory, gpu if forward else None)
        if judged is not None:
            out[name] = judged
    return out


def comparable_cold_input(i: ColdInput) -> bool:
    """A cold input known (width and height: the file report's cohort key) and shared by
    enough warm requests to compare with."""
    return i.width is not None and i.height is not None and i.warm_requests >= COMPARABLE_MIN_REQUESTS


def cold_paid_params(agg: FleetAggregates) -> tuple[float, bool] | None:
    """``(paid_min_ms, by_input)`` for :func:`otel_stages.analysis.clickhouse_queries.cold_paid_sql`
    when the cold requests compared are several (some may have paid a cold start and others not:
    :func:`otel_stages.analysis.cohorts.cold_figures`): ``by_input`` when they are compared with
    the warm requests of their inputs (each against its own input's), else ``paid_min_ms``
    against all warm requests (:func:`otel_stages.analysis.cohorts.paid_min_ms`). ``None``:
    nothing to read (one cold request)."""
    fig = _cold_base(agg)
    if fig is None or agg.total is None:
        return None
    if fig.count < 2 or fig.ratio is None:
        return None
    if fig.compared_with == SAME_INPUT:
        return 0.0, True
    return agg.total.p95_ms + (COLD_START_MIN_RATIO - 1) * agg.total.median_ms, False


def cold_split(agg: FleetAggregates, rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the cold requests that paid (``rows``: the ``cold`` side of
    :func:`otel_stages.analysis.clickhouse_queries.cold_paid_sql`) are some but not all of those
    compared: then the figures are theirs (:func:`_cold`)."""
    fig = _cold_base(agg)
    head = next((r for r in rows if r.get("stage") == "" and r.get("side", "cold") == "cold"), None)
    return fig is not None and head is not None and 0 < int(head["n"] or 0) < fig.count


def _cold(agg: FleetAggregates) -> ColdFigures | None:
    """The cold figures, those of the requests that paid a cold start when only some did (as
    :func:`otel_stages.analysis.cohorts.cold_figures` splits them)."""
    fig = _cold_base(agg)
    if fig is None:
        return None
    paid = agg.cold_start.paid if agg.cold_start is not None else None
    if paid is None or cold_paid_params(agg) is None or not 0 < paid.count < fig.count:
        return fig
    fig = replace(fig, count=paid.count, total_ms=paid.median_total_ms,
                  stages_ms=paid.stages_median_ms, stages_mean_ms=paid.stages_mean_ms,
                  without_penalty=fig.count - paid.count, failed=paid.failed)
    if fig.compared_with == SAME_INPUT and paid.warm is not None:  # the inputs that paid
        fig = replace(fig, comparable_requests=paid.warm[0], comparable_median_total_ms=paid.warm[1],
                      comparable_stages_ms=paid.warm[2],
                      cohort=agg.cohort_key(*paid.input) if paid.inputs == 1 else None)
    return fig


def _cold_base(agg: FleetAggregates) -> ColdFigures | None:
    """The cold figures over every cold request compared."""
    cold = agg.cold_start
    if cold is None:
        return None
    inputs = cold.by_input
    known = all(i.width is not None and i.height is not None for i in inputs)
    first = agg.counts.cold_not_first == 0
    if agg.total is None:  # only cold requests: said, with nothing to compare them with
        return ColdFigures(
            count=cold.total.count, total_ms=cold.total.median_ms, stages_ms=cold.stages_median_ms,
            stages_mean_ms=cold.stages_mean_ms, comparable_median_total_ms=None, comparable_stages_ms={},
            compared_with=ALL_WARM,
            comparable_requests=0, warm_median_total_ms=None, input_known=known,
            first_of_process=first, failed=cold.failed)
    same = bool(inputs) and all(comparable_cold_input(i) for i in inputs)
    if same and len(inputs) == 1:
        only = inputs[0]
        return ColdFigures(
            count=cold.total.count, total_ms=cold.total.median_ms, stages_ms=cold.stages_median_ms,
            stages_mean_ms=cold.stages_mean_ms, comparable_median_total_ms=only.warm_median_total_ms,
            comparable_stages_ms=only.warm_stages_median_ms, compared_with=SAME_INPUT,
            comparable_requests=only.warm_requests, warm_median_total_ms=agg.total.median_ms,
            cohort=agg.cohort_key(only.width, only.height, only.format), first_of_process=first,
            failed=cold.failed,
        )
    u = cold.union
    if u is not None:  # several inputs, or some not comparable: the comparable ones, together
        keys = {(agg.cohort_key(i.width, i.height, i.format), i.images_sig)
                for i in inputs if comparable_cold_input(i)}
        return ColdFigures(
            count=u.cold_requests, total_ms=u.cold_median_total_ms, stages_ms=u.cold_stages_median_ms,
            stages_mean_ms=u.cold_stages_mean_ms,
            comparable_median_total_ms=u.median_total_ms,
            comparable_stages_ms=u.stages_median_ms, compared_with=SAME_INPUT,
            comparable_requests=u.requests, warm_median_total_ms=agg.total.median_ms,
            cohort=next(iter(keys))[0] if len(keys) == 1 else None, first_of_process=first,
            left_out=cold.total.count - u.cold_requests, failed=u.cold_failed,
        )
    # several inputs of cold requests, some with too few warm requests of their own: compared
    # with all warm requests (as the trace report)
    return ColdFigures(
        count=cold.total.count, total_ms=cold.total.median_ms, stages_ms=cold.stages_median_ms,
        stages_mean_ms=cold.stages_mean_ms, comparable_median_total_ms=agg.total.median_ms,
        comparable_stages_ms=_warm_stages(agg),
        compared_with=ALL_WARM, comparable_requests=agg.total.count,
        warm_median_total_ms=agg.total.median_ms, input_known=known, first_of_process=first,
        failed=cold.failed,
    )


def _warm_stages(agg: FleetAggregates | CohortAggregate) -> dict[str, float]:
    """The warm requests' stage medians, then their untraced time's (as
    :func:`otel_stages.analysis.cohorts.cold_figures` compares a cold request with them)."""
    out = {n: s.ran.median_ms for n, s in agg.stages.items()}
    if agg.unaccounted is not None:
        out[COLD_UNTRACED] = agg.unaccounted.median_ms
    return out


def _unaccounted(agg: FleetAggregates | CohortAggregate) -> UnaccountedFigures | None:
    """The untraced time's figures of the run or of one cohort."""
    gap, total = agg.unaccounted, agg.total
    if gap is None or total is None:
        return None
    return UnaccountedFigures(
        median_ms=gap.median_ms, swing_ms=gap.swing_ms,
        share=gap.sum_ms / total.sum_ms if total.sum_ms > 0 else 0.0,
        explains=agg.unaccounted_explained or 0.0,
        alone=alone_of(gap, total),
    )


def _cohort_gpu(agg: FleetAggregates, cohort: CohortAggregate) -> GpuEvidence | None:
    """The GPU evidence within ``cohort``: its own (the engine's utilization during its warm
    forwards, split at its own slow-forward threshold); answers without it (an older run) fall
    back to the whole run's when it is the only cohort, else ``None``."""
    if cohort.gpu is not None:
        # the readings' clock is the run's: a cohort reads the whole window's misalignment
        # (otel_stages.analysis.gpu.misaligned_processes)
        return gpu_evidence(cohort.gpu if cohort.gpu.source != "metrics" else replace(
            cohort.gpu, misaligned_processes=agg.gpu.misaligned_processes, misaligned_means=None))
    return gpu_evidence(agg.gpu) if len(agg.cohorts) == 1 else None


def input_paid_needed(i: ColdInput) -> bool:
    """Whether a cold input's figures may split (as :func:`cold_paid_params` for the whole run):
    known, with warm requests, and two or more cold requests."""
    return (i.width is not None and i.height is not None and i.cold_requests >= 2
            and bool(i.warm_median_total_ms))


def _paid_only(i: ColdInput, fig: ColdFigures) -> ColdFigures:
    """A cohort's own cold figures, those of its cold requests that paid a cold start when only
    some did (:func:`otel_stages.analysis.cohorts.cold_figures`)."""
    if i.paid is None or not input_paid_needed(i) or not 0 < i.paid.count < fig.count:
        return fig
    return replace(fig, count=i.paid.count, total_ms=i.paid.median_total_ms,
                   stages_ms=i.paid.stages_median_ms, stages_mean_ms=i.paid.stages_mean_ms,
                   without_penalty=fig.count - i.paid.count)


def cohort_figures(agg: FleetAggregates, cohort: CohortAggregate) -> Figures:
    """The rules' input within one cohort (its own stages, total, cold requests of its input)."""
    own_cold = None
    # the cohort's cold inputs: its size and format, each with the images decoded (images_sig)
    rows = [] if agg.cold_start is None else [
        i for i in agg.cold_start.by_input
        if (i.width, i.height, i.format) == (cohort.width, cohort.height, cohort.format)]
    comparable = sorted((i for i in rows if i.warm_requests >= COMPARABLE_MIN_REQUESTS),
                        key=lambda i: -i.cold_requests)
    if comparable:  # with its own warm peers; the cohort's other cold inputs left out
        i = comparable[0]
        own_cold = _paid_only(i, ColdFigures(
            count=i.cold_requests, total_ms=i.cold_median_total_ms,
            stages_ms=i.cold_stages_median_ms, stages_mean_ms=i.cold_stages_mean_ms,
            comparable_median_total_ms=i.warm_median_total_ms,
            comparable_stages_ms=i.warm_stages_median_ms, compared_with=SAME_INPUT,
            comparable_requests=i.warm_requests, warm_median_total_ms=cohort.total.median_ms,
            cohort=cohort.key, left_out=sum(r.cold_requests for r in rows if r is not i)))
    elif rows:  # no input of theirs comparable: against the cohort's warm requests, never claimed
        i = max(rows, key=lambda r: r.cold_requests)
        own_cold = ColdFigures(
            count=sum(r.cold_requests for r in rows), total_ms=i.cold_median_total_ms,
            stages_ms=i.cold_stages_median_ms, stages_mean_ms=i.cold_stages_mean_ms,
            comparable_median_total_ms=cohort.total.median_ms,
            comparable_stages_ms=_warm_stages(cohort),
            compared_with=ALL_WARM, comparable_requests=cohort.total.count,
            warm_median_total_ms=cohort.total.median_ms)
    gpu = _cohort_gpu(agg, cohort) or GpuEvidence(level=LEVEL_NONE)
    return Figures(
        warm_requests=cohort.total.count,
        stages={n: stage_figures(s) for n, s in cohort.stages.items()},
        total=total_figures(cohort.total),
        gpu=gpu,
        unaccounted=_unaccounted(cohort),
        cold=own_cold,
        stage_evidence=with_mechanisms(_evidence(cohort.stages, lambda n: [
            (cohort.width, cohort.height, cohort.stages[n].ran.count,
             cohort.stages[n].ran.median_ms)]), stage_signals(agg, cohort)),
        per_request=True,
    )


def cohorts(agg: FleetAggregates) -> list[CohortFigures]:
    """Every cohort returned (largest first) with its verdict (the largest
    :data:`MAX_COHORT_VERDICTS` with at least ``MIN_WARM_RUNS`` requests)."""
    out = []
    for i, c in enumerate(agg.cohorts):
        cv = None
        if i < MAX_COHORT_VERDICTS and c.total.count >= MIN_WARM_RUNS:
            v = decide(cohort_figures(agg, c))
            cv = CohortVerdict(v.cause, v.stage, v.tentative)
        out.append(CohortFigures(c.key, c.total.count, c.total.median_ms, c.total.p95_ms, cv))
    return out


def figures(agg: FleetAggregates, cohort_list: Sequence[CohortFigures] | None = None) -> Figures:
    """Everything :func:`~otel_stages.analysis.decision.decide` reads, from the aggregates."""
    stages: Mapping[str, StageAggregate] = agg.stages
    return Figures(
        warm_requests=agg.counts.warm,
        stages={n: stage_figures(s) for n, s in stages.items()},
        total=None if agg.total is None else total_figures(agg.total),
        gpu=gpu_evidence(agg.gpu),
        unaccounted=_unaccounted(agg),
        cold=_cold(agg),
        cohorts=cohorts(agg) if cohort_list is None else cohort_list,
        input_mix_explains=agg.input_mix_explains,
        known_input_requests=agg.known_input_requests,  # the cohorts listed are the largest only
        process_mix=agg.process_mix,
        stage_evidence=with_mechanisms(
            _evidence(stages, lambda n: _sizes(agg.cohorts, n), agg.preprocess), stage_signals(agg)),
        failed_requests=agg.counts.failed, failed_cold=agg.counts.cold_failed,
        requests=agg.counts.requests,
        failure_kinds=agg.failure_kinds,
        failure_stages=agg.failure_stages,
        failed_median_total_ms=agg.failed_median_total_ms,
        failed_stages_ms=agg.failed_stages_ms,
        per_request=True,  # a stage's count is requests, as in the file report
        detached_requests=min(agg.issues.detached_requests, agg.counts.requests),
        outlived_requests=agg.issues.outlived_requests,
        outlived_p95_ms=agg.issues.outlived_p95_ms,
        before_requests=agg.issues.before_requests,
        before_p95_ms=agg.issues.before_p95_ms,
        clash_spans=agg.issues.clash_spans,
        set_apart=tuple(a.figures for a in agg.set_apart), warmup=agg.warmup,
        services=agg.services, service_requests=agg.service_requests,
        sampling=agg.sampling, calls=agg.calls, episode=agg.episode,
        calls_left_out=agg.calls_left_out,
    )


def verdict(agg: FleetAggregates, fig: Figures | None = None) -> Verdict:
    """The verdict for the aggregates: :func:`figures` (or ``fig``, already made from them)
    through the one rule set, then the overlap caveat the file report applies
    (:func:`otel_stages.analysis.stage_overlap.overlap_caveat`), the data the SQL did not check
    (:func:`~otel_stages.analysis.clickhouse_gaps.gaps_caveat`) and the slow requests a window's
    start cut off (:func:`~otel_stages.analysis.window_edge.window_caveat`)."""
    fig = figures(agg) if fig is None else fig
    out = decide(fig)
    overlap_caveat(out, fig, agg.overlap)
    gaps_caveat(out, [p for p in agg.problems if p.startswith(NOT_CHECKED)])
    window_caveat(out, agg.window_edge, agg.total.p95_ms if agg.total is not None else None,
                  band_ms(agg.stages, agg.total))
    return out



# --- the report's JSON ------------------------------------------------------------------------


def _distribution(s: Summary) -> Distribution:
    return Distribution(count=s.count, min_ms=s.min_ms, p5_ms=s.p5_ms, median_ms=s.median_ms,
                        p95_ms=s.p95_ms, max_ms=s.max_ms, mean_ms=s.mean_ms)


def shown_explains(agg: FleetAggregates, explains: float | None) -> float | None:
    """``explains`` as the report shows it: ``None`` under
    :data:`~otel_stages.analysis.decision.MIN_WARM_RUNS` warm requests (a covariance of a handful
    of points is noise), as the file report (:func:`otel_stages.analysis.diagnosis.diagnose`)."""
    return explains if agg.total is not None and agg.total.count >= MIN_WARM_RUNS else None


def _stage_stats(agg: FleetAggregates, s: StageAggregate) -> StageStats:
    r = s.ran
    return StageStats(name=s.name, count=r.count, min_ms=r.min_ms, p5_ms=r.p5_ms,
                      median_ms=r.median_ms, p95_ms=r.p95_ms, max_ms=r.max_ms, mean_ms=r.mean_ms,
                      share=s.share_of_time, swing_ms=r.swing_ms,
                      explains=shown_explains(agg, s.explained))


def report_dict(agg: FleetAggregates) -> dict[str, object]:
    """``report --clickhouse --json``: the trace report's keys (DESIGN.md section 3) for what the
    aggregates hold, with the same shapes and rounding (``requests``, ``counts``, ``total``,
    ``stages``, ``unaccounted``, ``cohorts``, ``input_mix_explains``, ``cold_start``, ``runs``,
    ``problems``, ``verdict``, ``noise``, ``gpu``, ``slowest``, ``signals``: per stage, as
    :meth:`otel_stages.analysis.mechanisms.StageSignals.to_dict`), plus ``source`` and
    ``aggregates`` (everything the engine returned, :meth:`FleetAggregates.to_dict`).
    ``set_apart``: the requests set apart as cold, as the file report lists them (at most
    :data:`~otel_stages.analysis.clickhouse_apart.MAX_APART_ROWS`)."""
    cohort_list = cohorts(agg)
    fig = figures(agg, cohort_list)
    top = verdict(agg, fig)
    total = None if agg.total is None else _distribution(agg.total)
    unaccounted = _unaccounted(agg)
    c = agg.counts
    return {
        "source": "clickhouse",
        "requests": c.requests,
        "counts": {"warm": c.warm, "cold": c.cold - c.cold_failed + c.set_apart, "failed": c.failed,
                   "incomplete": c.incomplete},
        "total": None if total is None else total.to_dict(),
        "stages": {n: _stage_stats(agg, s).to_dict() for n, s in agg.stages.items()},
        "overlap": None if agg.overlap is None else agg.overlap.to_dict(),
        "unaccounted": None if unaccounted is None else Unaccounted(
            unaccounted.median_ms, unaccounted.swing_ms, unaccounted.share,
            shown_explains(agg, unaccounted.explains or 0.0)).to_dict(),
        "cohorts": [cohort_to_dict(k) for k in share_tentative(cohort_list, top.tentative)],
        # the engine returns the largest AggregateQuery.top_cohorts: how many there are in all
        "cohorts_total": agg.cohorts_total,
        "input_mix_explains": None if agg.input_mix_explains is None
        else round(agg.input_mix_explains, 4),
        "process_mix": None if agg.process_mix is None else agg.process_mix.to_dict(),
        # requests that started before a window's start and ended inside it (left out)
        "window_edge": None if agg.start_ns is None else agg.window_edge.to_dict(),
        "sampling": None if agg.sampling is None else agg.sampling.to_dict(),
        "cold_start": None if fig.cold is None else cold_to_dict(fig.cold),
        "set_apart": [{
            "trace_id": a.figures.trace_id, "seq": a.figures.seq, "reason": a.figures.reason,
            "cohort": agg.cohort_key(a.width, a.height, a.format),
            "total_ms": round(a.figures.total_ms, 3),
            "comparable_median_total_ms": round(a.figures.comparable_median_total_ms, 3),
            "ratio": round(a.figures.ratio, 2),
            "idle_s": None if a.figures.idle_s is None else round(a.figures.idle_s, 1),
        } for a in agg.set_apart],
        "failures": failures_to_dict(fig, verdict_band_ms(fig)),
        "episode": None if fig.episode is None else fig.episode.to_dict(),
        "runs": [{"service_name": r.service_name or None,
                  "service_instance_id": r.service_instance_id or None,
                  "host_name": r.host_name or None,
                  "process_pid": r.process_pid or None,
                  "first_unix_ns": r.first_unix_ns, "last_unix_ns": r.last_unix_ns,
                  "requests": r.requests, "reported": True} for r in agg.runs],
        "problems": list(agg.problems),
        "verdict": top.to_dict(),
        "noise": noise_to_dict(noise_band(fig.stages.values(), fig.reference_ms), total)
        if c.warm else None,
        "gpu": fig.gpu.to_dict(),
        "slowest": [{"trace_id": s.trace_id, "seq": s.seq, "total_ms": round(s.total_ms, 3),
                     "stages": {k: round(v, 3) for k, v in s.stages_ms.items()},
                     "unaccounted_ms": round(s.unaccounted_ms, 3),
                     "image_width": s.image_width, "image_height": s.image_height,
                     "image_bytes": s.image_bytes, "error": s.error} for s in agg.slowest],
        "signals": {name: sig.to_dict() for name, sig in stage_signals(agg).items()},
        "comparison": None,  # no --baseline with --clickhouse yet (DESIGN.md section 3)
        "aggregates": agg.to_dict(),
    }
