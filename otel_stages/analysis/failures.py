"""Failed requests in a verdict: when they lead it and what it says of them. Pure; on
:class:`~otel_stages.analysis.figures.Figures` only (the rules in
:mod:`otel_stages.analysis.decision` call :func:`failures_first`).

- :func:`failures_dominate`: :data:`FAILED_MIN_FRACTION` of the requests or more failed. The
  timings describe only the requests that survived (often the cheap ones: a request that fails in
  decode never reaches forward), and the user-visible problem is the errors. Evidence says so
  first, with the error types, and the advice is to fix the failures, not to send more requests.
- :func:`failures_slow`: fewer fail, but at least :data:`FAILED_SLOW_MIN_FRACTION` of the
  requests, and slowly (their median total beyond the warm p95 plus the run's noise band: a
  deadline, a stall). They are the slow tail users see, which the warm timings leave out, so a
  verdict on those timings alone is tentative: evidence and advice start with the failed
  requests, their median total and the stage that held most of it (:data:`FAILED_STAGE_MIN_PART`).
  Requests that fail fast (a 400 in 2 ms) are no tail: they keep the line at the end.
"""

from __future__ import annotations

from otel_stages.analysis import advice as advice_text
from otel_stages.analysis.figures import Figures
from otel_stages.analysis.units import duration, pct
from otel_stages.analysis.verdict import Verdict

#: At this fraction of failed requests or more the failures come first in the evidence and the
#: advice: a quarter of the requests failing is the problem users see, and the survivors' timings
#: are a biased sample (requests that fail early are cheap, those that time out are slow).
FAILED_MIN_FRACTION = 0.25
#: At this fraction of failed requests or more, failing slowly (:func:`failures_slow`), they come
#: first too and the verdict is tentative: the swing is judged at the warm p95, which 5 % of the
#: requests make by themselves, so failed requests at this share, had they been counted, would
#: set the tail the verdict reads (as for
#: :data:`~otel_stages.analysis.caveats.CLASH_MIN_FRACTION` and
#: :data:`~otel_stages.analysis.caveats.POOLED_SERVICE_MIN_SHARE`, 5 % of the requests is where
#: a subset changes the p95).
FAILED_SLOW_MIN_FRACTION = 0.05
#: A stage is named as where the slow failed requests spent most of their time when its median
#: over them is at least this part of their median total (half: "most"); else the advice is to
#: find where that time went (it lies outside every stage span, or is spread over stages).
FAILED_STAGE_MIN_PART = 0.5
#: Error kinds named in the failure line; the rest are counted as "other".
MAX_ERROR_KINDS = 3
#: ``Figures.failure_kinds`` key for failed requests that recorded no ``error.type`` /
#: ``exception.type``.
KIND_UNKNOWN = "error type not recorded"
#: How the evidence line that asks for more runs begins ("only 9 warm requests: ...").
_MORE_RUNS_EVIDENCE = "only "


def failures_dominate(fig: Figures) -> bool:
    """:data:`FAILED_MIN_FRACTION` of the requests or more ended with an error, not counting the
    cold requests that failed after paying the cold start (``ColdFigures.failed``: the cold
    start's, said there, as in :func:`failures_slow`)."""
    cold = fig.cold.failed if fig.cold is not None else 0
    return fig.requests > 0 and fig.failed_requests - cold >= FAILED_MIN_FRACTION * fig.requests


def failures_slow(fig: Figures, band_ms: float | None) -> bool:
    """At least :data:`FAILED_SLOW_MIN_FRACTION` of the requests ended with an error, and their
    median total lies beyond the warm requests' p95 plus ``band_ms`` (the run's noise band, ms;
    ``None``: no band, as under ``MIN_WARM_RUNS`` warm requests): the failed requests are the
    slow tail (a deadline, a stall), not fast rejections. Cold requests that failed after paying
    the cold start (``ColdFigures.failed``) are the cold start's, said there: not counted here."""
    failed = fig.failed_median_total_ms
    p95 = None if fig.total is None else fig.total.p95_ms
    cold = fig.cold.failed if fig.cold is not None else 0
    if (band_ms is None or p95 is None or failed is None or fig.requests <= 0
            or fig.failed_requests - cold < FAILED_SLOW_MIN_FRACTION * fig.requests):
        return False
    return failed > p95 + band_ms


def failures_lead(fig: Figures, band_ms: float | None) -> bool:
    """The failed requests come first in the evidence and the advice: :func:`failures_dominate`
    or :func:`failures_slow`."""
    return failures_dominate(fig) or failures_slow(fig, band_ms)


def failed_stage(fig: Figures) -> tuple[str | None, bool]:
    """The stage with the largest median over the failed requests (``None`` without stage spans),
    and whether it held most of their time (at least :data:`FAILED_STAGE_MIN_PART` of their
    median total)."""
    if not fig.failed_stages_ms:
        return None, False
    name = max(fig.failed_stages_ms, key=lambda n: fig.failed_stages_ms[n])
    total = fig.failed_median_total_ms or 0.0
    return name, total > 0 and fig.failed_stages_ms[name] >= FAILED_STAGE_MIN_PART * total


def _slow_part(fig: Figures, band_ms: float) -> str:
    """``their median total 2.00 s is beyond ...; they spent most of it in forward (...)``."""
    assert fig.total is not None and fig.total.p95_ms is not None
    assert fig.failed_median_total_ms is not None
    text = (f"their median total {duration(fig.failed_median_total_ms)} is beyond the warm"
            f" requests' p95 {duration(fig.total.p95_ms)} plus this run's noise band"
            f" {duration(band_ms)}")
    name, most = failed_stage(fig)
    if name is None:
        return text + "; they recorded no stage spans"
    stage_ms = fig.failed_stages_ms[name]
    if most:
        return text + f"; they spent most of it in {name} (median {duration(stage_ms)} there)"
    return (text + f"; no stage holds half of it (the largest, {name}, median"
            f" {duration(stage_ms)}): the rest lies outside the stage spans or spread over them")


def failure_line(fig: Figures, band_ms: float | None = None) -> str:
    """``83% of requests failed (25 of 30; ...)``: the share, the kinds and where they stopped;
    when :func:`failures_slow` (``band_ms``: the run's noise band), how long they took and where."""
    kinds = sorted(fig.failure_kinds.items(), key=lambda kv: (-kv[1], kv[0]))
    named = [f"{k}: {n}" for k, n in kinds[:MAX_ERROR_KINDS]]
    rest = sum(n for _, n in kinds[MAX_ERROR_KINDS:])
    if rest:
        named.append(f"other: {rest}")
    where = sorted(fig.failure_stages.items(), key=lambda kv: (-kv[1], kv[0]))
    stopped = "; ".join(f"{w}: {n}" for w, n in where[:MAX_ERROR_KINDS])
    ok = fig.requests - fig.failed_requests
    head = (f"{pct(fig.failed_requests / fig.requests)} of requests failed ({fig.failed_requests} of"
            f" {fig.requests}; {', '.join(named) or KIND_UNKNOWN}"
            f"{f'; {stopped}' if stopped else ''})")
    first = f"at least {pct(FAILED_MIN_FRACTION)} failing is the problem to fix first; "
    if band_ms is not None and failures_slow(fig, band_ms):
        return (f"{head}, slowly: {_slow_part(fig, band_ms)}; they are the slow tail, so the verdict"
                f" is tentative: {first if failures_dominate(fig) else ''}the timings below"
                f" describe only the {ok} that succeeded")
    return f"{head}: {first}the timings below describe only the {ok} that succeeded"


def failures_first(verdict: Verdict, fig: Figures, band_ms: float | None = None) -> None:
    """When :func:`failures_dominate`: the failure line first, the fix-the-errors advice first, and
    no advice (or evidence) to simply send more requests. When :func:`failures_slow` (``band_ms``:
    the run's noise band): the failure line first, with their median total and stage, the advice
    to find why that stage stalls first, no "steady" advice, and the verdict tentative. Fewer
    failures (named in the evidence by the caller): a steady verdict's advice says its steadiness
    is of the requests that succeeded."""
    slow = failures_slow(fig, band_ms)
    if not failures_dominate(fig) and not slow:
        if fig.failed_requests > 0 and fig.requests > 0:  # fewer: never hidden by "steady"
            verdict.advice = [advice_text.steady_but_failed(fig.failed_requests)
                              if a == advice_text.STEADY else a for a in verdict.advice]
        return
    verdict.evidence.insert(0, failure_line(fig, band_ms))
    if slow:  # the failed requests are the swing "steady" would deny
        name, most = failed_stage(fig)
        verdict.advice = [a for a in verdict.advice if a != advice_text.STEADY]
        verdict.advice.insert(0, advice_text.slow_failures(name if most else None))
    if failures_dominate(fig):
        verdict.evidence = [verdict.evidence[0], *(e for e in verdict.evidence[1:]
                                                   if not e.startswith(_MORE_RUNS_EVIDENCE))]
        verdict.advice = [a for a in verdict.advice if a != advice_text.MORE_RUNS
                          and not a.startswith(advice_text.MORE_RUNS_PREFIX)]
        verdict.advice.insert(1 if slow else 0, advice_text.FIX_FAILURES)
    verdict.tentative = verdict.tentative or verdict.cause is not None


def failures_to_dict(fig: Figures, band_ms: float | None) -> dict[str, object] | None:
    """The report's ``failures`` object (``None`` without failed requests): ``requests``,
    ``share`` (of all finished requests), ``kinds`` (error kind -> requests), ``stopped`` (where
    they stopped -> requests), ``median_total_ms``, ``stages`` (stage -> median ms over them, 0
    where a failed request lacks it), ``stage`` (the stage with the largest median),
    ``slow`` (:func:`failures_slow`; ``None`` without a noise band), ``leads`` (the failures
    come first in the verdict: :func:`failures_lead`) and ``cold`` (those that were their
    process's cold request: ``Figures.failed_cold``)."""
    if fig.failed_requests <= 0 or fig.requests <= 0:
        return None
    total = fig.failed_median_total_ms
    return {
        "requests": fig.failed_requests,
        "share": round(fig.failed_requests / fig.requests, 4),
        "kinds": dict(sorted(fig.failure_kinds.items(), key=lambda kv: (-kv[1], kv[0]))),
        "stopped": dict(sorted(fig.failure_stages.items(), key=lambda kv: (-kv[1], kv[0]))),
        "median_total_ms": None if total is None else round(total, 3),
        "stages": {n: round(ms, 3) for n, ms in fig.failed_stages_ms.items()},
        "stage": failed_stage(fig)[0],
        "slow": None if band_ms is None or fig.total is None else failures_slow(fig, band_ms),
        "leads": failures_lead(fig, band_ms),
        "cold": fig.failed_cold,
    }

