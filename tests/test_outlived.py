"""A request span that closes before the work it times (a fresh-eyes tester's input: a streamed
response whose request span ends 5 ms after forward starts, forward streaming on for 100-400 ms;
only the part inside the request counts, so both reports said a confident "latency is steady").
At :data:`~otel_stages.analysis.caveats.OUTLIVED_MIN_FRACTION` of the requests or more, with the
median time after the request at the noise band or more, the verdict is tentative, the reason
first in the evidence and the advice. Each threshold pinned on both sides; the file report and
the ClickHouse report agree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from otel_stages.analysis import advice
from otel_stages.analysis.caveats import OUTLIVED_MIN_FRACTION, outlived_caveat
from otel_stages.analysis.decision import decide
from otel_stages.analysis.verdict import Verdict
from tests.test_clickhouse_issues import MS, STABLE, Spans, edited, engine, named, reports, shift
from tests.test_decision import figures, stage

__all__ = ["engine"]  # the module's chDB fixture


@pytest.mark.parametrize(("outlived", "after_ms", "caveat"), [
    (5, 3.0, True),      # 5 % of the requests, the median after them at the band
    (4, 3.0, False),     # under 5 %
    (5, 2.999, False),   # under the band: work after the answer too short to hide a swing
    (100, 400.0, True),
])
def test_a_request_span_closing_before_its_work_makes_the_verdict_tentative(
        outlived: int, after_ms: float, caveat: bool) -> None:
    assert OUTLIVED_MIN_FRACTION == 0.05
    fig = replace(figures(stage("forward", 40.0, explains=0.9), total_swing=40.0), requests=100,
                  outlived_requests=outlived, outlived_median_ms=after_ms)
    v = Verdict("forward", "forward", ["forward swings"], ["fix forward"])
    outlived_caveat(v, fig, band_ms=3.0)
    assert v.tentative is caveat
    assert (v.advice[0] == advice.END_REQUEST_SPAN) is caveat
    assert ("ends after the request span" in v.evidence[0]) is caveat
    if caveat:
        assert v.evidence[0].startswith(f"in {outlived} of 100 requests a stage span ends after")


def test_the_rules_apply_the_caveat_to_a_steady_verdict() -> None:
    """Through :func:`decide`: the steady verdict stays, tentative, with the reason first."""
    fig = replace(figures(stage("forward", 40.0, explains=0.9), total_swing=1.0), requests=30,
                  outlived_requests=30, outlived_median_ms=200.0)
    v = decide(fig)
    assert v.cause == "stable" and v.tentative
    assert v.advice[0] == advice.END_REQUEST_SPAN
    assert decide(replace(fig, outlived_requests=0, outlived_median_ms=None)).tentative is False


def _streamed(count: int, after_ms: Callable[[int], float] | None = None) -> Callable[[int, Spans], None]:
    """In the first ``count`` of every 30 requests the request span ends 5 ms after forward starts
    and forward goes on (``after_ms(i)`` after the request's end; default 95-391 ms)."""
    def edit(i: int, spans: Spans) -> None:
        if i % 30 >= count:
            return
        request, forward = named(spans, "request"), named(spans, "forward")
        start = int(forward["startTimeUnixNano"])
        request["endTimeUnixNano"] = str(start + 5 * MS)
        after = after_ms(i) if after_ms else 95 + 37 * (i % 9)
        forward["endTimeUnixNano"] = str(start + 5 * MS + round(after * MS))
    return edit


@pytest.mark.parametrize(("count", "caveat"), [(30, True), (2, True), (1, False)])
def test_streamed_responses_read_alike_in_both_reports(engine, tmp_path: Path, count: int,
                                                       caveat: bool) -> None:
    got, want = reports(engine, edited(STABLE, tmp_path / f"stream{count}.jsonl", _streamed(count)))
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    assert v["tentative"] is caveat, v
    assert (v["advice"][0] == advice.END_REQUEST_SPAN) is caveat
    if caveat:
        assert v["evidence"][0].startswith(f"in {count} of 30 requests a stage span ends after")
    assert any(p.startswith("stage spans reach outside their request span") for p in want["problems"])


def test_work_after_the_answer_under_the_band_is_no_caveat(engine, tmp_path: Path) -> None:
    """Every request's forward ends 1 ms after the request (a span closed a hair late): named in
    the problems, but too short to hide a swing the verdict could see."""
    def edit(i: int, spans: Spans) -> None:
        shift(named(spans, "forward"), 0, 1 * MS)

    got, want = reports(engine, edited(STABLE, tmp_path / "late.jsonl", edit))
    assert got["verdict"] == want["verdict"] and not want["verdict"]["tentative"]
    assert want["noise"]["band_ms"] > 1.0


def test_a_stage_starting_after_its_request_ended_is_streamed_or_skewed(engine, tmp_path: Path) -> None:
    """A tester's input: one process, the request span closes when the handler returns the
    streamed response and forward starts just after it, running 95-391 ms (read as "stable"
    with the untraced time as clock skew, confidently). Within one process there is no skew to
    blame, but the spans cannot say so (another host's forward 5 s ahead looks the same): the
    verdict is tentative and names both."""
    def edit(i: int, spans: Spans) -> None:
        request, forward = named(spans, "request"), named(spans, "forward")
        start = int(forward["startTimeUnixNano"])
        request["endTimeUnixNano"] = str(start - MS // 2)
        forward["endTimeUnixNano"] = str(start + (95 + 37 * (i % 9)) * MS)

    got, want = reports(engine, edited(STABLE, tmp_path / "after.jsonl", edit))
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    assert v["tentative"] and v["advice"][0] == advice.END_REQUEST_SPAN
    assert "or the stage ran on a host whose clock is ahead" in v["evidence"][0]


def test_only_the_long_generations_streamed(engine, tmp_path: Path) -> None:
    """A tester's input: 40 % of the requests stream 400 ms on after the request span closes, the
    others take their 20 ms inside: the hidden time is the top of the swing, so the verdict is
    tentative though most requests are whole."""
    got, want = reports(engine, edited(STABLE, tmp_path / "long.jsonl",
                                       _streamed(12, lambda i: 400.0)))
    assert got["verdict"] == want["verdict"]
    assert want["verdict"]["tentative"] and want["verdict"]["advice"][0] == advice.END_REQUEST_SPAN
