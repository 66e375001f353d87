"""Caveats the rules in :mod:`otel_stages.analysis.decision` add to a verdict when the data
behind it is thin or odd. Pure; on :class:`~otel_stages.analysis.figures.Figures` only.

- :func:`untraced_is_largest`: more request time lies outside every stage span than inside any one
  stage. Then "start with the largest stage" would point at a small part of the request (stage
  spans on a skewed clock, zero-length stages, missing instrumentation): evidence and advice say
  the time is untraced and to instrument it; unless :func:`untraced_is_skew`: then the time is
  most likely stage spans recorded on a skewed clock, and the advice is to sync the clocks.
- :func:`partial_stage_lines`: a stage that ran in fewer than :data:`STAGE_PRESENT_MIN_FRACTION` of
  the warm requests: its min / median / p95 describe only the requests that had it.
- :func:`offset_line`: stages whose ``explains`` lies below ``-OFFSET_MIN_EXPLAINS`` or above
  ``1 + OFFSET_MIN_EXPLAINS``: they offset each other (one is slower when the other is faster),
  so their parts of the total's variance cancel (see :mod:`otel_stages.analysis.stats`).
- :func:`set_apart_lines`: warm requests reported apart as cold (first of a new input, after an
  idle gap, after a failed first request), so the verdict's evidence agrees with the set-apart list;
  the warm-up after the cold requests in one line (how many requests it lasted), and
  :func:`warm_up_advice` advises warming up with that many requests, not one (in place of the
  cold start's one dummy request). :func:`warmup_caveat`: a warm-up still standing out after
  :data:`WARMUP_MAX_REQUESTS` requests may not have ended, and the warm runs may hold its tail:
  a verdict on a warm swing is tentative, with the reason first.
- :func:`episode_caveat`: the slow warm requests fall in one stretch of the run
  (:mod:`otel_stages.analysis.episode`): the verdict is tentative, the stretch and the advice to
  look at what ran then first.
- :func:`outlived_caveat` / :func:`before_caveat`: standard stage spans end after (start before)
  their request span by the noise band or more at the p95 over the warm requests: the request
  span closes before its work or a stage ran on a clock ahead (behind); only the part inside
  counts, so the verdict is tentative, with the reason first.
- :func:`misaligned_gpu_caveat`: a forward verdict whose GPU readings do not line up with the
  forwards (less busy during them than between them: a sampler's clock or timestamps off) is
  tentative, the GPU line first in the evidence and the advice to check the sampler's clock first.
- :func:`clash_caveat`: span ids shared by different spans in :data:`CLASH_MIN_FRACTION` of the
  requests or more (two recordings with the same ids merged, a badly seeded id generator): only
  the first span of each id is kept, so which requests the statistics describe depends on the
  order the spans were read. The verdict is tentative, with the reason first.
- :func:`services_caveat`: requests (warm and cold) of more than one ``service.name`` are pooled
  when those of all but the largest number at least :data:`POOLED_SERVICE_MIN_REQUESTS`, or at
  least two and :data:`POOLED_SERVICE_MIN_SHARE` of them all: two services (another model, another
  pipeline) differ for reasons no stage shows, so a swing across them reads as a stage's swing.
  The verdict is tentative, with the reason first, and the advice says to report each service
  alone (``--service``), naming the service a call stage calls into where there is one
  (:mod:`otel_stages.analysis.calls`: its requests hold the calls' time, and so the cause; the
  command picks that service's requests, :func:`otel_stages.analysis.services.pick_service`),
  else the largest. A call into requests of the calling requests' own ``service.name`` (a gateway
  and a worker told apart only by ``service.namespace`` or instance) pools two services under one
  name, which ``--service`` cannot part: tentative too, the advice to give each its own name first.
- :func:`together_caveat`: the stages slow in the same requests: the part of the request total's
  variance their covariances make (``1 - sum(alone)`` over the stages and the untraced time,
  :attr:`~otel_stages.analysis.figures.StageFigures.alone`) reaches :data:`TOGETHER_MIN_SHARE`
  and exceeds what the verdict's stage explains. A cause that slows the whole process (threads
  holding the GIL, another process burning the CPU) then reads as whichever stage it hits most,
  a different one from run to run; unless a stage's cost follows the input's size or the input
  mix dominates (the inputs then move the stages together: ``decision`` skips the rule), or the
  verdict already names a process-wide mechanism (CPU contention or throttling, GC pauses, a
  blocked event loop: the line then backs it), the verdict is tentative, the reason first and the
  advice to find what slows the process first (after recording input sizes, where none is: larger
  inputs would move the stages together too). The same reading when the verdict's stage takes
  most of the time, so that the covariances are a small part of the variance, but the other stages
  follow it (:func:`followers`): at least :data:`FOLLOW_MIN_STAGES` of the stages before it, every
  one judged (not the queue, nor the stages after it, which wait on it or scale with its output),
  each correlating at least :data:`FOLLOW_MIN_CORRELATION` with the rest of the request and varying
  by at least :data:`FOLLOW_MIN_RELATIVE` of the stage's variation, each relative to its own mean
  (a process slowed 2x slows every stage 2x in the same requests).
- :func:`sampled_caveat`: the recording is sampled (gaps in ``request.seq``;
  :mod:`otel_stages.analysis.sampled`): the figures lean toward the slow requests a sampler keeps
  whole. The verdict is tentative, the reason first, and the advice leads with unbiased figures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from otel_stages import semconv
from otel_stages.analysis import advice as advice_text
from otel_stages.analysis.contention import CAUSE_CPU_CONTENTION
from otel_stages.analysis.episode import episode_advice, episode_line
from otel_stages.analysis.figures import (
    REASON_AFTER_FAILED_START,
    REASON_AFTER_IDLE,
    REASON_BEHIND_COLD,
    REASON_WARM_UP,
    ApartFigures,
    Figures,
    StageFigures,
    WarmupFigures,
)
from otel_stages.analysis.mechanisms import CAUSE_CPU_THROTTLED, CAUSE_EVENT_LOOP_BLOCKED, CAUSE_GC_PAUSE
from otel_stages.analysis.sampled import is_sampled, sampled_line
from otel_stages.analysis.units import duration, pct
from otel_stages.analysis.verdict import CAUSE_CALL, CAUSE_COLD_START, CAUSE_STABLE, Verdict

#: The warm-up after a process's cold request is looked for in at most this many warm requests
#: after it (:func:`otel_stages.analysis.cohorts.set_apart_and_warmup`): lazy compilation,
#: autotuning and caches filling take "several" requests, not dozens. Without a cap a process slow
#: throughout (a bad replica that started in the recording) would be set apart whole as warm-up;
#: with it, a warm-up that still stands out at the cap is said not to have ended
#: (:func:`warmup_caveat`), and the requests after it stay warm.
WARMUP_MAX_REQUESTS = 10

#: A stage present in fewer than this fraction of the warm requests is named: its figures describe
#: a subset (a stage skipped on a cache hit, or spans lost for some requests).
STAGE_PRESENT_MIN_FRACTION = 0.9
#: ``explains`` further than this outside 0..1 means stages offset each other (rounding and
#: ordinary sampling noise keep independent stages within a few percent of 0..1).
OFFSET_MIN_EXPLAINS = 0.1
#: When at least this part of the requests has a stage span wholly outside its request span, the
#: untraced time is read as clock skew rather than missing instrumentation: skew between two hosts
#: moves every span the other host records, so it shows in most requests, not in a few.
SKEWED_MIN_FRACTION = 0.5
#: When the time a standard stage span ends after its request span, over all warm requests (0
#: where none does), reaches the noise band at this percentile (:func:`outlived_caveat`), the
#: request span closes before the work it times: a streamed response whose span ends when the
#: first bytes leave while the model goes on generating (or the stage ran on a clock ahead of the
#: request's: the spans cannot tell the two apart). Only the part inside counts, so a swing in the
#: rest is not seen, and the verdict is tentative. The p95, as for the swing: 5 % of the requests
#: are enough to be the top of it (long generations may be the only ones streamed), and many
#: short overhangs (a span closed a hair late) cannot hide a few long ones as a median would.
#: Custom stages are left out: one after the answer (an export, a log write) is work after it.
OUTLIVED_PERCENTILE = 95
#: When the time a standard stage span starts before its request span, over all warm requests (0
#: where none does), reaches the noise band at this percentile (:func:`before_caveat`), the stage
#: ran on a clock behind the request's (a GPU worker on another host; or the request span starts
#: after its work began). Only the part inside counts, so the stage's figures are clipped (a span
#: wholly before counts 0 ms) and the verdict is tentative, as for a clock ahead
#: (:data:`OUTLIVED_PERCENTILE`, the same percentile for the same reasons: a skew shows in every
#: request the other host serves, and 5 % of the requests are the top of the swing).
BEFORE_PERCENTILE = 95
#: When the spans that share an id with a different span number at least this part of the
#: requests, the verdict is tentative (:func:`clash_caveat`): a stray duplicate id among many
#: requests changes nothing, but at this rate whole requests are merged or lost depending on the
#: order the spans were read (the file order, the import order).
CLASH_MIN_FRACTION = 0.05
#: Requests of other services than the largest pool with it when they number at least this many
#: (:func:`services_caveat`): as many as a verdict needs (``decision.MIN_WARM_RUNS``); a stray
#: request of another service (a health check traced like a request) does not pool.
POOLED_SERVICE_MIN_REQUESTS = 5
#: ... or at least two and this share of all requests (:func:`services_caveat`): 4 requests of
#: another model among 30 are the top of the swing (its p95) by themselves.
POOLED_SERVICE_MIN_SHARE = 0.05
#: The part of the request total's variance that comes from stages slowing in the same requests
#: (their covariances: ``1 - sum(alone)`` over the stages and the untraced time) from which a
#: stage verdict is read as the whole process slowing (:func:`together_caveat`), when it also
#: exceeds what the stage explains. Independent stages leave it near 0 (sampling noise of a few
#: hundred requests: +-0.1; a tester's single-stage causes measured -0.08 .. 0.30, stages that
#: offset each other below 0); a process-wide slowdown (two threads holding the GIL, processes
#: burning the CPU) measured 0.53 .. 0.71. 0.4 sits between, above what noise and a queue that
#: waits behind a slow forward (which do move together) give.
TOGETHER_MIN_SHARE = 0.4
#: :func:`followers`: another stage follows the verdict's stage when its per-request time
#: correlates at least this much with the rest of the request (``corr(X, total - X)``, from its
#: ``explains`` e and ``alone`` a: ``(e - a) / sqrt(a (1 - 2e + a))``) ... A tester's process
#: slowed 2x in 30 % of the requests: 0.99 .. 1.00 for download, decode and resize under a forward
#: of 90 % of the time; stages beside a single-stage cause -0.37 .. 0.74 (GIL runs already read by
#: :data:`TOGETHER_MIN_SHARE` up to 0.74, every other one under 0.7).
FOLLOW_MIN_CORRELATION = 0.8
#: ... and varies by at least this part of the verdict's stage's variation, each relative to its
#: own mean (coefficients of variation: ``sqrt(a_X / a_S) * share_S / share_X``): stages that move
#: in step by a few percent of their time are jitter, not a slowdown of the process (2x the stage
#: and 2x the others: 1.0).
FOLLOW_MIN_RELATIVE = 0.5
#: The least number of stages that must follow, every judged one (one stage in step may be a
#: shared input; two independent parts of the pipeline slowing with it are the process).
FOLLOW_MIN_STAGES = 2
#: Stages under this part of all request time are not judged (their relative figures are noise);
#: nor is the queue (requests wait behind slow forwards: it follows a slow model by design).
FOLLOW_MIN_SHARE = 0.01
#: Causes that already name a slowdown of the whole process: the stages slowing together backs
#: them (:func:`together_caveat` adds its line, keeps the verdict firm).
PROCESS_WIDE_CAUSES = frozenset({CAUSE_CPU_CONTENTION, CAUSE_CPU_THROTTLED, CAUSE_GC_PAUSE,
                                 CAUSE_EVENT_LOOP_BLOCKED})
#: The services :func:`services_caveat` names (the largest; "and more" after them).
MAX_SERVICES_NAMED = 6


def untraced_is_largest(fig: Figures) -> bool:
    """More request time outside every stage span than in any one stage (ties go to the stages)."""
    gap = fig.unaccounted
    if gap is None or gap.share <= 0:
        return False
    return gap.share > max((s.share for s in fig.stages.values()), default=0.0)


def untraced_is_skew(fig: Figures) -> bool:
    """At least :data:`SKEWED_MIN_FRACTION` of the requests have a stage span wholly outside their
    request span: the untraced time is then most likely those stages' time on a skewed clock."""
    return fig.requests > 0 and fig.detached_requests >= SKEWED_MIN_FRACTION * fig.requests


def untraced_share_line(fig: Figures) -> str:
    """The evidence sentence when :func:`untraced_is_largest`."""
    gap = fig.unaccounted
    assert gap is not None
    covered = sum(s.share for s in fig.stages.values())
    largest = max(fig.stages.values(), key=lambda s: s.share)
    most = "most request time" if gap.share >= 0.5 else "the largest part of request time"
    if untraced_is_skew(fig):
        return (f"{most} lies outside the stage spans ({pct(gap.share)}, median"
                f" {duration(gap.median_ms)} per request), but in {fig.detached_requests} of"
                f" {fig.requests} requests a stage span lies wholly outside its request span: that"
                " time is most likely those stages' on a host whose clock is skewed, not untraced"
                " work (see the warning)")
    return (f"{most} lies outside the stage spans: {pct(gap.share)} is untraced"
            f" (median {duration(gap.median_ms)} per request), more than any stage (the largest,"
            f" {largest.name}, is {pct(largest.share)}); the stage spans cover {pct(covered)}")


def untraced_advice(fig: Figures) -> str:
    """What to do first about the untraced time when :func:`untraced_is_largest`."""
    return advice_text.SYNC_CLOCKS if untraced_is_skew(fig) else advice_text.UNTRACED_SHARE


def partial_stage_lines(fig: Figures) -> list[str]:
    """``download appears in only 15 of 29 warm requests ...`` for each stage present in fewer than
    :data:`STAGE_PRESENT_MIN_FRACTION` of the warm requests (histogram sources count spans, not
    requests, and are skipped)."""
    n = fig.warm_requests
    partial = partial_stages(fig)
    return [
        f"{s.name} appears in only {s.count} of {n} warm requests: its min / median / p95 are over"
        f" those {s.count}; its share and explains count it as 0 ms in the other {n - s.count}"
        f" (a stage skipped on some requests, or its spans lost)"
        for s in fig.stages.values() if s.name in partial
    ]


def offsetting(fig: Figures) -> list[str]:
    """Stages whose ``explains`` lies more than :data:`OFFSET_MIN_EXPLAINS` outside 0..1."""
    return [s.name for s in fig.stages.values() if s.explains is not None
            and (s.explains < -OFFSET_MIN_EXPLAINS or s.explains > 1 + OFFSET_MIN_EXPLAINS)]


def partial_stages(fig: Figures) -> list[str]:
    """Stages present in fewer than :data:`STAGE_PRESENT_MIN_FRACTION` of the warm requests
    (per-request figures only)."""
    n = fig.warm_requests
    if n <= 0 or not fig.per_request:
        return []
    return [s.name for s in fig.stages.values() if s.count < STAGE_PRESENT_MIN_FRACTION * n]


def offset_line(fig: Figures, overlap_explains: float | None = None) -> str | None:
    """The sentence about stages whose ``explains`` lies outside 0..1, or ``None``: a stage
    missing from some warm requests (:func:`partial_stages`) counts 0 ms there, which is no
    trade-off; a stage above 1 by no more than the double-counted time's part
    (``overlap_explains``, :class:`~otel_stages.analysis.stage_overlap.Overlap`, with
    :data:`OFFSET_MIN_EXPLAINS` to spare) holds time counted twice (its spans run at the same
    time), which is no trade-off either; the others offset each other."""
    names = offsetting(fig)
    if not names:
        return None
    partial = set(partial_stages(fig))

    def parts(which: set[str]) -> str:
        return ", ".join(f"{s.name} {pct(s.explains or 0.0)}" for s in fig.stages.values()
                         if s.name in which)

    lines = []
    missing = {n for n in names if n in partial}
    if missing:
        lines.append(f"explains outside 0-100% ({parts(missing)}): counted as 0 ms in the warm"
                     " requests without it, so the requests missing its spans, not its own"
                     " swing, set this figure")
    doubled = set() if overlap_explains is None or overlap_explains <= 0 else {
        s.name for s in fig.stages.values() if s.name in names and s.name not in missing
        and (s.explains or 0.0) > 1 and (s.explains or 0.0) - overlap_explains <= 1 + OFFSET_MIN_EXPLAINS}
    if doubled:
        lines.append(f"explains outside 0-100% ({parts(doubled)}): spans of a request that run at"
                     " the same time (concurrent downloads, a span and its child) count their"
                     " shared time twice, so it swings and explains more than the request total;"
                     f" the (overlap) row takes the double count back (it explains"
                     f" {pct(overlap_explains or 0.0)})")
    offset = set(names) - missing - doubled
    if offset:
        swing = (f"{duration(fig.total.swing_ms)}" if fig.total is not None else "little")
        lines.append(f"explains outside 0-100% ({parts(offset)}): these stages offset each other"
                     " (when one is slower the other is faster), so their parts of the total's"
                     f" variance cancel; each swings more than the request total ({swing}), which"
                     " is held steady by the trade-off")
    return "; ".join(lines)


def missing_spans_advice(fig: Figures) -> str | None:
    """Advice when a stage is missing from some warm requests (:func:`partial_stages`) and the
    untraced time is the verdict: that time is most likely the lost spans', not untraced work."""
    partial = partial_stages(fig)
    if not partial:
        return None
    return (f"{', '.join(partial)} spans are missing from some warm requests and their time shows"
            " as untraced: find why they were not recorded (spans dropped by a full export queue"
            " or a sampler, context lost across a thread or process) before instrumenting more")


def set_apart_lines(apart: Sequence[ApartFigures], warmup: WarmupFigures | None = None
                    ) -> list[str]:
    """One sentence per warm request reported apart as cold, as the set-apart list shows it; the
    warm-up (``warmup``; its requests in ``apart``) in one sentence first."""
    out = [] if warmup is None else [warmup_line(warmup)]
    for a in apart:
        if a.reason == REASON_WARM_UP:
            continue  # in the warm-up's sentence
        who = f"seq {a.seq}" if a.seq is not None else f"trace {a.trace_id}"
        if a.reason == REASON_AFTER_IDLE:
            why = f"after {a.idle_s:.0f} s idle" if a.idle_s is not None else "after an idle gap"
        elif a.reason == REASON_AFTER_FAILED_START:
            why = ("right after the process's first request failed: the cold start may have moved"
                   " to it")
        elif a.reason == REASON_BEHIND_COLD:
            why = ("it started while the process's cold request still ran (a start-up burst:"
                   " waiting for it, or served by a process still warming), so it pays the cold"
                   " start, not a warm-up of its own")
        else:
            why = "the first request with its input in this process"
        out.append(f"{who} took {duration(a.total_ms)}, {a.ratio:.1f}x the median of comparable"
                   f" warm requests ({duration(a.comparable_median_total_ms)}), {why}; reported"
                   " apart from warm runs")
    return out


def warmup_line(w: WarmupFigures) -> str:
    """The warm-up's sentence: how many requests it lasted (the longest, with the processes), how
    many were set apart and how far they stood out, and where it had not ended."""
    lasted = "lasted" if w.longest_ended else "lasted at least"
    one = w.processes == 1
    where = "" if one else f" in the longest of {w.processes} processes"
    after = "the cold request" if one else "each process's cold request"
    many = "s" if w.requests != 1 else ""
    line = (f"the warm-up {lasted} {w.longest_requests} requests{where}: {w.requests}"
            f" request{many} right after {after} stood out one after another (up to"
            f" {w.max_ratio:.1f}x the median of their input's warm requests after the warm-up,"
            " each at least their p95 plus their median) and"
            f" {'are' if w.requests != 1 else 'is'} reported apart from warm runs as warm-up")
    if w.capped:
        who = "it" if one else f"in {w.capped} of the processes it"
        line += (f"; {who} had not ended after the {WARMUP_MAX_REQUESTS} warm requests after the"
                 " cold one that are looked at: it may last longer")
    if w.unended > w.capped:
        n = w.unended - w.capped
        who = "it" if one else f"in {n} of the processes it"
        line += f"; {who} had not ended when the process's requests in the recording did"
    return line


def warm_up_advice(verdict: Verdict, w: WarmupFigures) -> None:
    """Warm up with as many requests as the warm-up lasted (:func:`advice.warm_up_with`): in place
    of the cold start's one dummy request (:data:`advice.WARM_UP`) where the advice has it, which
    would not be enough, else added."""
    line = advice_text.warm_up_with(w.longest_requests, w.longest_ended)
    for i, a in enumerate(verdict.advice):
        if a == advice_text.WARM_UP:
            verdict.advice[i] = line
            return
        if a == "also: " + advice_text.WARM_UP:
            verdict.advice[i] = "also: " + line
            return
    verdict.advice.append("also: " + line)


def warm_up_call_clause(stage: str, services: Sequence[str]) -> str:
    """What the warm-up's sentence adds where the warm-up was paid inside ``stage``, a call
    ``--service`` left out, into the requests of ``services``: theirs."""
    if len(services) == 1:
        (service,) = services
        return (f"; each of them waited in {stage} for {service}'s requests while those warmed"
                f" up (a call --service leaves out), so the warm-up is {service}'s")
    whose = " or ".join(f"{s}'s" for s in services)
    return (f"; each of them waited in {stage} for {whose} requests while those started cold or"
            f" warmed up (a call --service leaves out), so the warm-up is theirs")


def warmup_caveat(verdict: Verdict, fig: Figures,
                  call: tuple[str, Sequence[str]] | None = None) -> None:
    """Tentative, the warm-up's sentence and advice first, when a warm-up still stood out at
    :data:`WARMUP_MAX_REQUESTS` (``WarmupFigures.capped``) and the verdict is on a warm swing: the
    requests after the cap stay warm, and the swing may be the warm-up's tail. (A steady verdict,
    or a cold start over steady warm runs, shows the warm runs hold no tail.) ``call``: ``(stage,
    services)``, the warm-up was paid inside that call, which ``--service`` left out: the advice
    is to warm the called services up (:func:`advice.warm_up_in_call`), never the picked one's
    model."""
    w = fig.warmup
    if w is None or not w.capped or verdict.cause in (None, CAUSE_STABLE, CAUSE_COLD_START):
        return
    verdict.tentative = True
    line = warmup_line(w) + (warm_up_call_clause(*call) if call is not None else "")
    if line in verdict.evidence:
        verdict.evidence.remove(line)
    verdict.evidence.insert(0, line + ", and the warm runs may hold its tail, so this is tentative")
    advice = (advice_text.warm_up_in_call(call[0], call[1], w.longest_requests, w.longest_ended)
              if call is not None else advice_text.warm_up_with(w.longest_requests, w.longest_ended))
    verdict.advice[:] = [a for a in verdict.advice if a not in (advice, "also: " + advice)]
    verdict.advice.insert(0, advice)


def episode_caveat(verdict: Verdict, fig: Figures, *, explained: bool = False) -> None:
    """Tentative, the episode's line and advice first, when the verdict is on a warm swing and
    its slow requests fall in one stretch of the run (``Figures.episode``,
    :mod:`otel_stages.analysis.episode`); not when the input mix or the processes explain the
    swing (``explained``: their lines lead)."""
    e = fig.episode
    if e is None or explained or verdict.cause in (None, CAUSE_STABLE, CAUSE_COLD_START):
        return
    verdict.tentative = True
    verdict.evidence.insert(0, episode_line(e))
    verdict.advice.insert(0, episode_advice(e))


def outlived_caveat(verdict: Verdict, fig: Figures, band_ms: float) -> None:
    """Tentative, with the reason first in the evidence and the advice, when the
    :data:`OUTLIVED_PERCENTILE` of the time standard stage spans end after their request span
    over the warm requests (:attr:`Figures.outlived_p95_ms`) is ``band_ms`` (the run's noise
    band) or more: the figures leave that time out."""
    after = fig.outlived_p95_ms
    if not fig.outlived_requests or after is None or after < band_ms:
        return
    verdict.tentative = True
    verdict.evidence.insert(0, (
        f"in {fig.outlived_requests} of {fig.warm_requests} warm requests a stage span ends after"
        f" the request span (p{OUTLIVED_PERCENTILE} {duration(after)} after it, beyond this run's"
        f" noise band {duration(band_ms)}): the request span closes before the work it times (a streamed"
        " response whose span ends when the first bytes leave, or work handed off after the"
        " answer; or the stage ran on a host whose clock is ahead), and only the part inside"
        " counts, so these figures leave that time out and the verdict is tentative (see the"
        " problems)"))
    verdict.advice.insert(0, advice_text.END_REQUEST_SPAN)


def before_caveat(verdict: Verdict, fig: Figures, band_ms: float) -> None:
    """Tentative, with the reason first in the evidence and the advice, when the
    :data:`BEFORE_PERCENTILE` of the time standard stage spans start before their request span
    over the warm requests (:attr:`Figures.before_p95_ms`) is ``band_ms`` (the run's noise band)
    or more: the stage figures are clipped to the request span (module docstring)."""
    before = fig.before_p95_ms
    if not fig.before_requests or before is None or before < band_ms:
        return
    verdict.tentative = True
    verdict.evidence.insert(0, (
        f"in {fig.before_requests} of {fig.warm_requests} warm requests a stage span starts before"
        f" the request span (p{BEFORE_PERCENTILE} {duration(before)} before it, beyond this run's"
        f" noise band {duration(band_ms)}): the stage ran on a host whose clock is behind the"
        " request's (or the request span starts after the work it times began), and only the part"
        " inside counts, so the stage figures are clipped (a span wholly before counts 0 ms) and"
        " the verdict is tentative (see the problems)"))
    verdict.advice.insert(0, advice_text.SYNC_CLOCKS_BEHIND)


def misaligned_gpu_caveat(verdict: Verdict, fig: Figures) -> None:
    """Tentative, with the GPU evidence first and :data:`~otel_stages.analysis.advice.GPU_MISALIGNED`
    first in the advice, when the verdict is about the forward stage and its GPU readings do not
    line up with the forwards (:attr:`GpuEvidence.misaligned_processes
    <otel_stages.analysis.gpu.GpuEvidence.misaligned_processes>`, :func:`otel_stages.analysis.gpu.falls`):
    the level is ``thin`` then, and the stage's swing stays the claim."""
    if not fig.gpu.misaligned_processes or verdict.stage != semconv.STAGE_FORWARD:
        return
    verdict.tentative = True
    line = fig.gpu.describe()
    verdict.evidence = [line, *(e for e in verdict.evidence if e != line)]
    verdict.advice = [advice_text.GPU_MISALIGNED,
                      *(a for a in verdict.advice if a != advice_text.GPU_MISALIGNED)]


def clash_caveat(verdict: Verdict, fig: Figures) -> None:
    """Tentative, with the reason first in the evidence, when :attr:`Figures.clash_spans` reach
    :data:`CLASH_MIN_FRACTION` of the requests (module docstring)."""
    if fig.requests <= 0 or fig.clash_spans < CLASH_MIN_FRACTION * fig.requests:
        return
    verdict.tentative = True
    verdict.evidence.insert(0, (
        f"{fig.clash_spans} span{'s' if fig.clash_spans != 1 else ''} share a span id with a"
        f" different span ({fig.requests} requests): only the first of each id is kept, so which"
        " requests these figures describe depends on the order the spans were read; the verdict"
        " is tentative until the ids are unique (see the problems)"))


def services_caveat(verdict: Verdict, fig: Figures) -> None:
    """Tentative, with the reason first in the evidence and a per-service report first in the
    advice, when :attr:`Figures.services` holds two services or more and the requests (warm and
    cold) of all but the largest number at least :data:`POOLED_SERVICE_MIN_REQUESTS`, or at least
    two and :data:`POOLED_SERVICE_MIN_SHARE` of them all (module docstring): one other service's
    or many small ones' (one-shot processes are all cold requests)."""
    if len(fig.services) < 2:
        _shared_name_caveat(verdict, fig)
        return
    total = max(fig.service_requests, sum(n for _, n in fig.services))
    others = total - fig.services[0][1]
    if others < POOLED_SERVICE_MIN_REQUESTS and (others < 2 or others < POOLED_SERVICE_MIN_SHARE * total):
        return
    verdict.tentative = True
    listed = fig.services[:MAX_SERVICES_NAMED]
    named = ", ".join(f"{name or '(no service.name)'} {n}" for name, n in listed)
    if len(fig.services) > len(listed) or total > sum(n for _, n in listed):
        named += ", and more"
    # a total that swings with no stage standing out: the services' other stages alone make
    # their totals differ, so "what slows the whole process" is a guess (a tester's gateway and
    # worker, both steady, pooled: "look for CPU contention")
    spread = advice_text.SPREAD in verdict.advice
    if spread:
        verdict.advice.remove(advice_text.SPREAD)
    verdict.evidence.insert(0, (
        f"requests of {len(fig.services)}{'+' if total > sum(n for _, n in fig.services) else ''}"
        f" services are pooled here ({named}; warm and cold requests): another model or"
        " pipeline per service makes requests differ for reasons no stage shows, so a swing"
        " across services reads as a stage's swing"
        + ("; with no stage standing out, the total's swing may be the services' difference"
           " alone" if spread else "") + "; the verdict is tentative"))
    # a called service first (its requests hold the calls' time, and so the cause), else the largest;
    # the calling service first where the calls' own time is the verdict (the wait is the caller's)
    apart = [c for c in fig.calls if c.service and not c.shared_name]
    callers = {c.caller for c in apart}
    # the end of a chain of calls (gateway -> router -> worker) holds the cause
    called = next((c for c in apart if c.service not in callers), next(iter(apart), None))
    first = called.service if called else next((name for name, _ in fig.services if name), None)
    why = f": the service {called.stage} calls" if called else ""
    if called is not None and verdict.cause == CAUSE_CALL:
        # the calling service of the call whose own time (or count) swings
        mine = [c for c in apart if c.stage == verdict.stage] or [called]
        called = max(mine, key=lambda c: (c.own_swing_ms or 0.0, c.repeated))
        first = called.caller or next(
            (name for name, _ in fig.services if name and name != called.service), None)
        # (that report sees one stage: the split into the caller's wait and theirs is this one's)
        why = (f": the calling service, where {verdict.stage}'s swing lies, for its stages' figures"
               f" alone; there {verdict.stage} is one stage of its own, {called.service}'s requests"
               f" left out, so its split into the caller's wait and the called requests' time is"
               " this report's")
    elif called is not None and called.repeated and verdict.stage is None:  # (the count swings)
        first = next((name for name, _ in fig.services if name and name != called.service), None)
        why = f": the service whose {called.stage} calls {called.service} more than once in some requests"
    example = f" --service {first}" if first else " --service NAME"
    verdict.advice.insert(0, f"report each service alone (otel-stages report ...{example}{why})")


def _shared_name_caveat(verdict: Verdict, fig: Figures) -> None:
    """:func:`services_caveat`'s reading of one ``service.name`` whose requests call each other."""
    called = next((c for c in fig.calls if c.shared_name), None)
    if called is None:
        return
    verdict.tentative = True
    name = called.service or "(no service.name)"
    verdict.evidence.insert(0, (
        f"{called.stage} calls requests of the same service.name ({name}) that this report reads"
        " too: a caller's requests and its callee's, two services with other stages (a gateway and"
        " a worker told apart only by service.namespace or instance), are pooled here as one, so a"
        + (" caller's stages are ranked with its callee's" if verdict.cause == CAUSE_CALL else
           " swing of the callee's reads in the caller's totals as well")
        + "; the verdict is tentative"))
    verdict.advice.insert(0, (
        f"give the processes {called.stage} calls their own service.name (OpenTelemetry's"
        " service.name names one logical service), then report each service alone"
        " (otel-stages report ... --service NAME)"))


def together_share(fig: Figures) -> float | None:
    """The part of the request total's variance the stages' covariances make: ``1 - sum(alone)``
    over the stages and the untraced time (:attr:`StageFigures.alone
    <otel_stages.analysis.figures.StageFigures.alone>`); ``None`` when any part's is unknown
    (histograms) or there are no stages."""
    parts = [s.alone for s in fig.stages.values()]
    if fig.unaccounted is not None:
        parts.append(fig.unaccounted.alone)
    if not fig.stages or any(p is None for p in parts):
        return None
    return 1.0 - sum(p for p in parts if p is not None)


def _apart(larger: float, smaller: float) -> tuple[str, str]:
    """Two fractions as percentages with the fewest decimals (0 to 2) that print them apart."""
    for digits in (0, 1, 2):
        a, b = f"{100 * larger:.{digits}f}", f"{100 * smaller:.{digits}f}"
        if a != b:
            return f"{a}%", f"{b}%"
    return f"{100 * larger:.2f}%", f"{100 * smaller:.2f}%"


def followers(fig: Figures, stage: StageFigures) -> list[tuple[str, float, float]]:
    """The stages that follow ``stage`` (module docstring): ``(name, correlation, relative)``
    each, in ``fig``'s stage order, where at least :data:`FOLLOW_MIN_STAGES` are judged and every
    judged one follows; else ``[]``. Judged: every stage before ``stage`` in ``fig``'s order (the
    standard stages in pipeline order, then the custom ones) but the queue, with
    :data:`FOLLOW_MIN_SHARE` of the request time or more and known ``explains`` and ``alone``. The
    stages after it are not: a postprocess that copies the model's output back (waiting on the
    GPU stream) or scales with the output's length slows with a slow forward, a single-stage
    cause; custom stages, whose place in the pipeline the figures do not hold, are judged only
    before a custom verdict stage."""
    if not stage.alone or stage.alone <= 0 or stage.share <= 0:
        return []
    found = []
    for s in fig.stages.values():
        if s is stage:
            break  # (the stages after it may wait on it or scale with its output: not judged)
        if s.name == semconv.STAGE_QUEUE or s.share < FOLLOW_MIN_SHARE:
            continue
        if s.explains is None or not s.alone or s.alone <= 0:
            return []
        rest = 1.0 - 2.0 * s.explains + s.alone  # var(total - X) / var(total)
        if rest <= 0:
            return []
        correlation = (s.explains - s.alone) / math.sqrt(s.alone * rest)
        relative = math.sqrt(s.alone / stage.alone) * stage.share / s.share
        if correlation < FOLLOW_MIN_CORRELATION or relative < FOLLOW_MIN_RELATIVE:
            return []
        found.append((s.name, correlation, relative))
    return found if len(found) >= FOLLOW_MIN_STAGES else []


def _follow_head(stage: StageFigures, found: list[tuple[str, float, float]]) -> str:
    names = ", ".join(name for name, _, _ in found)
    low_r, high_r = min(r for _, r, _ in found), max(r for _, r, _ in found)
    low_v, high_v = min(v for _, _, v in found), max(v for _, _, v in found)
    r_text = f"{low_r:.2f}" if f"{low_r:.2f}" == f"{high_r:.2f}" else f"{low_r:.2f} .. {high_r:.2f}"
    v_text = (f"{low_v:.2f}x" if f"{low_v:.2f}" == f"{high_v:.2f}"
              else f"{low_v:.2f}x .. {high_v:.2f}x")
    return (f"the other stages slow in the same requests as {stage.name} ({names}: correlation"
            f" with the rest of the request {r_text}), each by a comparable part of its own time"
            f" ({v_text} {stage.name}'s variation, relative to their means)")


def together_caveat(verdict: Verdict, fig: Figures) -> None:
    """The stages slowing together (module docstring): a line first and, unless the verdict
    names a process-wide mechanism, the verdict tentative with :data:`advice.TOGETHER
    <otel_stages.analysis.advice.TOGETHER>` first. Only for a verdict on a stage of ``fig``."""
    stage = fig.stages.get(verdict.stage or "")
    if stage is None or verdict.cause is None or stage.explains is None:
        return
    if any(e.follows_size for e in fig.stage_evidence.values()):
        return  # a stage's cost follows the input's size: the inputs move the stages together
    together = together_share(fig)
    if together is not None and together >= TOGETHER_MIN_SHARE and together > stage.explains:
        ranked = sorted((s for s in fig.stages.values() if s.explains is not None),
                        key=lambda s: -(s.explains or 0.0))[:3]
        parts = ", ".join(f"{s.name} {pct(s.explains or 0.0)}" for s in ranked)
        more, less = _apart(together, stage.explains)
        head = (f"the stages slow together: {more} of the request total's variance comes from"
                f" stages slowing in the same requests, more than {stage.name} explains ({less};"
                f" the most: {parts})")
    else:
        found = followers(fig, stage)
        if not found:
            return
        head = _follow_head(stage, found)
    if verdict.cause in PROCESS_WIDE_CAUSES:
        verdict.evidence.append(head + f": {verdict.cause} slows the whole process, not"
                                f" {stage.name} alone")
        return
    verdict.tentative = True
    unknown = not fig.cohorts and not fig.known_input_requests
    verdict.evidence.insert(0, head + ": a cause that slows the whole process (threads holding"
                            " the GIL or the CPU, another process, a collector pause) reads as"
                            " whichever stage it hits most"
                            + (", or the inputs differ in size (none is recorded to tell)"
                               if unknown else "")
                            + f", so the verdict on {stage.name} is tentative")
    verdict.advice.insert(0, advice_text.TOGETHER)
    if unknown:  # larger inputs would move the stages together too
        verdict.advice[:] = [advice_text.SIZE_UNKNOWN,
                             *(a for a in verdict.advice if a != advice_text.SIZE_UNKNOWN)]


def sampled_caveat(verdict: Verdict, fig: Figures) -> None:
    """Tentative, the reason first in the evidence and the way to unbiased figures first in the
    advice, when :attr:`Figures.sampling` reads as sampled
    (:func:`otel_stages.analysis.sampled.is_sampled`)."""
    coverage = fig.sampling
    if coverage is None or not is_sampled(coverage):
        return
    verdict.tentative = True
    verdict.evidence.insert(0, sampled_line(
        coverage, None if fig.total is None else fig.total.median_ms))
    verdict.advice.insert(0, advice_text.SAMPLED)
