"""Odd traces never become requests: spans with impossible times, orphan stage spans, stage spans
at the root, per-request span names, stages outside their request or overlapping each other."""

from __future__ import annotations

import pytest
from msgspec.structs import replace

from otel_stages import semconv
from otel_stages.analysis import Recording, Span, diagnose
from otel_stages.analysis.naming import looks_per_request
from otel_stages.analysis.requests import group_spans
from otel_stages.analysis.screen import screen_spans
from tests.test_verdict import DECODE, DOWNLOAD, FORWARD, QUEUE, T0_NS, build, steady

MS = 1_000_000


def _one_request(children: list[tuple[str, int, int, dict]], *, start: int = T0_NS,
                 end_ms: int = 100) -> list[Span]:
    """A request span [start, start + end_ms] with children (name, start ms, end ms, attributes)."""
    trace, req = "a" * 32, "1" * 16
    spans = [Span(trace, req, None, semconv.SPAN_REQUEST, start, start + end_ms * MS)]
    for i, (name, a, b, attrs) in enumerate(children):
        spans.append(Span(trace, f"{i + 2:016x}", req, name, start + a * MS, start + b * MS, attrs))
    return spans


# --- impossible times ----------------------------------------------------------------------------


Y2000_NS, DAY_NS = 946_684_800 * 10**9, 86_400 * 10**9  # literal: a changed limit must fail


@pytest.mark.parametrize("start, end, kept", [
    (Y2000_NS - 1, Y2000_NS + MS, False),
    (Y2000_NS, Y2000_NS + MS, True),
    (T0_NS, T0_NS + DAY_NS, True),
    (T0_NS, T0_NS + DAY_NS + 1, False),
    (T0_NS, T0_NS - 1, False),
    (T0_NS, T0_NS, True),
])
def test_spans_with_impossible_times_are_left_out(start, end, kept):
    span = Span("a" * 32, "b" * 16, None, FORWARD, start, end)
    screened = screen_spans([span])
    assert (screened.spans == [span]) is kept
    assert bool(screened.problems) is not kept


def test_a_1970_span_inside_a_real_request_is_named_and_kept_out_of_the_stats():
    telemetry = build(steady(25))
    first_request = next(s for s in telemetry.spans if s.name == semconv.SPAN_REQUEST)
    telemetry.spans.append(Span(first_request.trace_id, "f" * 16, first_request.span_id, FORWARD,
                                1_000_000_000, T0_NS + 50 * MS))
    report = diagnose(telemetry)
    assert report.requests == 25
    assert report.stages[FORWARD].max_ms < 200
    (problem,) = [p for p in report.problems if "before 2000-01-01" in p]
    assert "1 span left out" in problem and "1970-01-01T00:00:01Z" in problem


NOW_NS = 1_790_000_000 * 10**9  # 2026-09-21
YEAR_NS = 366 * DAY_NS


@pytest.mark.parametrize("start_ns, unit", [
    (NOW_NS // 1000, "microseconds"),
    (NOW_NS // 10**6, "milliseconds"),
    (Y2000_NS // 1000, "microseconds"),                       # just at 2000 read as µs
    (Y2000_NS // 1000 - 1, None),                            # just below: not µs, and x10^6 is too late
    ((NOW_NS + YEAR_NS) // 1000, "microseconds"),            # a year ahead: still plausible
    ((NOW_NS + YEAR_NS) // 1000 + 1, None),                  # past that: no unit reads right
    (NOW_NS // 10**9, None),                                 # seconds: ambiguous with a duration
    (1_000_000_000, None),                                   # a 1 s duration written as a time
])
def test_a_start_in_another_unit_is_recognised(start_ns, unit):
    from otel_stages.analysis.screen import unit_mistake
    got = unit_mistake(start_ns, now_ns=NOW_NS)
    assert (got[1] if got else None) == unit


def test_microsecond_times_are_named_once_and_not_called_non_stage_spans():
    """Every span written in µs: one problem naming the likely unit with the time it would be,
    and no second "none is a stage span" line (they were left out, not unrecognised)."""
    telemetry = build(steady(5))
    spans = [replace(s, start_ns=s.start_ns // 1000, end_ns=s.end_ns // 1000) for s in telemetry.spans]
    report = diagnose(Recording(spans, telemetry.metrics, []))
    assert report.requests == 0
    (problem,) = report.problems
    assert "read as microseconds" in problem and "likely wrote another unit" in problem
    assert "none is a stage span" not in " ".join(report.problems)


def test_spans_that_pass_screening_but_are_no_stages_are_named():
    spans = [Span("a" * 32, f"{i + 1:016x}", None, "GET /health", T0_NS, T0_NS + MS) for i in range(3)]
    (problem,) = diagnose(Recording(spans, [], [])).problems
    assert problem.startswith("3 spans read but none is a stage span")


# --- orphans and roots ----------------------------------------------------------------------------


def test_orphan_stage_spans_are_incomplete_not_requests():
    telemetry = build(steady(25))
    for i in range(3):  # a 30 s forward whose parent never arrived, in its own trace
        telemetry.spans.append(Span(f"{i:032x}", f"{i + 1:016x}", "e" * 16, FORWARD,
                                    T0_NS + i * MS, T0_NS + i * MS + 30_000 * MS))
    report = diagnose(telemetry)
    assert report.requests == 25 and report.counts.incomplete == 3
    assert report.stages[FORWARD].max_ms < 200
    assert any(p.startswith("3 incomplete traces left out") and "30000.0 ms" in p
               for p in report.problems)
    assert report.to_dict()["counts"]["incomplete"] == 3


def test_stage_spans_at_the_root_are_incomplete():
    spans = [Span(f"{i:032x}", f"{i + 1:016x}", None, DECODE, T0_NS, T0_NS + 5 * MS) for i in range(4)]
    report = diagnose(Recording(spans=spans))
    assert report.requests == 0 and report.counts.incomplete == 4
    assert any("with no request span above" in p and "otel_stages.request()" in p
               for p in report.problems)


# --- per-request span names ----------------------------------------------------------------------


@pytest.mark.parametrize("name, per_request", [
    ("download /img/13.jpg", True), ("GET https://cdn/x.jpg", True), ("fetch 3f2a9c1d7e", True),
    ("request 1234", True), ("download", False), ("resize_v2", False), ("tokenize", False),
    ("stage 12", False), ("forward_32", False),
])
def test_names_with_paths_or_ids_look_per_request(name, per_request):
    assert looks_per_request(name) is per_request


def _url_named(n: int, *, attribute: bool) -> list[Span]:
    spans = []
    for i in range(n):
        attrs = {semconv.STAGE_NAME: DOWNLOAD} if attribute else {}
        d = 10 + (200 if i % 4 == 0 else 0)  # every 4th download is slow
        children = [(f"download /img/{i}.jpg", 0, d, attrs), (DECODE, d, d + 8, {}),
                    (FORWARD, d + 8, d + 108, {})]
        one = _one_request(children, start=T0_NS + i * 1000 * MS, end_ms=d + 110)
        spans += [replace(s, trace_id=f"{i:032x}") for s in one]
    return spans


def test_per_request_names_are_grouped_by_the_stage_attribute():
    report = diagnose(Recording(spans=_url_named(30, attribute=True)))
    assert list(report.stages) == [DOWNLOAD, DECODE, FORWARD]
    assert (report.verdict.cause, report.verdict.stage) == ("transfer", DOWNLOAD)
    (problem,) = [p for p in report.problems if "per-request" in p]
    assert "grouped by their 'stage' attribute (download)" in problem


def test_per_request_names_without_the_attribute_say_how_to_fix_them():
    report = diagnose(Recording(spans=_url_named(30, attribute=False)))
    assert all("/" not in name for name in report.stages)
    assert report.verdict.stage is None or "/" not in report.verdict.stage
    (problem,) = [p for p in report.problems if "per-request" in p]
    assert "left out of the stage rows" in problem and "url.full" in problem
    assert report.unaccounted is not None and report.unaccounted.share > 0.02  # their time


@pytest.mark.parametrize("names, renamed", [(20, False), (21, True)])  # MAX_STAGE_NAMES 20
def test_more_than_twenty_distinct_names_are_per_request(names, renamed):
    spans = []
    for i in range(names - 1):  # one custom, path-free name per request, plus forward
        label = "step_" + "".join(chr(97 + int(d)) for d in f"{i:02d}")
        one = _one_request([(label, 0, 5, {semconv.STAGE_NAME: "prepare"}), (FORWARD, 5, 50, {})],
                           start=T0_NS + i * 1000 * MS, end_ms=50)
        spans += [replace(s, trace_id=f"{i:032x}") for s in one]
    assert len({s.name for s in spans if s.name != semconv.SPAN_REQUEST}) == names
    grouping = group_spans(spans)
    stage_names = {n for r in grouping.requests for n in r.stages_ms}
    if renamed:
        assert stage_names == {"prepare", FORWARD} and grouping.problems
    else:
        assert "prepare" not in stage_names and not grouping.problems


def _fixed_stages(requests: int, names: int, sometimes: int = 0) -> list[Span]:
    """``requests`` requests, each with ``names`` fixed custom stages (``safety_0``...) and a
    forward; ``safety_0`` is missing from all but ``sometimes`` of them when ``sometimes``."""
    spans = []
    for i in range(requests):
        kids = [(f"safety_{k}", k, k + 1, {}) for k in range(names)
                if not (k == 0 and sometimes and i >= sometimes)]
        one = _one_request([*kids, (FORWARD, names, names + 50, {})],
                           start=T0_NS + i * 1000 * MS, end_ms=names + 50)
        spans += [replace(s, trace_id=f"{i:032x}") for s in one]
    return spans


def test_many_fixed_stage_names_that_recur_stay_stages():
    """21 fixed custom names in every request (a tester's pipeline with 16 custom stages plus the
    5 standard ones was read as per-request: 480 spans dropped, no verdict)."""
    grouping = group_spans(_fixed_stages(10, 21))
    assert not grouping.problems
    assert {n for r in grouping.requests for n in r.stages_ms} == {*(f"safety_{k}" for k in range(21)), FORWARD}


@pytest.mark.parametrize("sometimes, renamed", [(5, False), (4, True)])  # RECURRING_NAME_MIN_SHARE 0.5
def test_past_twenty_names_a_name_on_half_the_requests_recurs(sometimes, renamed):
    """Past MAX_STAGE_NAMES names, one on 5 of 10 requests (half the most used name's spans) is a
    stage; on 4 it is read as per-request (no stage attribute: left out, and said)."""
    grouping = group_spans(_fixed_stages(10, 21, sometimes))
    stage_names = {n for r in grouping.requests for n in r.stages_ms}
    assert ("safety_0" not in stage_names) is renamed
    assert bool(grouping.problems) is renamed
    assert "safety_1" in stage_names


# --- shares, out-of-parent and overlapping stages ---------------------------------------------------


def test_shares_and_unaccounted_add_up():
    gaps = []
    for i in range(25):  # 12 ms between stages in every request
        children = [(DOWNLOAD, 0, 2, {}), (DECODE, 8, 14, {}), (QUEUE, 20, 21, {}),
                    (FORWARD, 21, 100 + (i % 3) * 10, {})]
        one = _one_request(children, start=T0_NS + i * 1000 * MS, end_ms=100 + (i % 3) * 10)
        gaps += [replace(s, trace_id=f"{i:032x}") for s in one]
    report = diagnose(Recording(spans=gaps))
    assert report.unaccounted is not None
    assert report.unaccounted.median_ms == pytest.approx(12.0)
    total = sum(s.share for s in report.stages.values()) + report.unaccounted.share
    assert total == pytest.approx(1.0, abs=1e-9)
    assert report.to_dict()["unaccounted"]["share"] == pytest.approx(report.unaccounted.share, abs=1e-4)


def test_a_stage_outliving_its_request_counts_only_inside_and_is_named():
    spans = _one_request([(DECODE, 0, 10, {}), (FORWARD, 10, 9_000, {})], end_ms=20)
    grouping = group_spans(spans)
    (request,) = grouping.requests
    assert request.stages_ms[FORWARD] == pytest.approx(10.0)  # 10 ms inside, 8.98 s after
    assert request.unaccounted_ms == pytest.approx(0.0)
    (problem,) = [p for p in grouping.problems if "outside their request" in p]
    assert "fire-and-forget" in problem and "8980.0 ms" in problem


@pytest.mark.parametrize("overlap_ms, named", [(0.04, False), (0.06, True)])  # tolerance 0.05 ms
def test_overlapping_stages_are_named(overlap_ms, named):
    trace, req = "a" * 32, "1" * 16
    over = int(overlap_ms * MS)
    spans = [Span(trace, req, None, semconv.SPAN_REQUEST, T0_NS, T0_NS + 30 * MS),
             Span(trace, "2" * 16, req, DOWNLOAD, T0_NS, T0_NS + 10 * MS),
             Span(trace, "3" * 16, req, DECODE, T0_NS + 10 * MS - over, T0_NS + 30 * MS)]
    grouping = group_spans(spans)
    problems = [p for p in grouping.problems if "overlap" in p]
    assert bool(problems) is named
    if named:
        assert "download and decode" in problems[0]
    (request,) = grouping.requests
    assert request.unaccounted_ms == pytest.approx(0.0)
