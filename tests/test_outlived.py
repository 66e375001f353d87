"""A request span that closes before the work it times (a fresh-eyes tester's input: a streamed
response whose request span ends 5 ms after forward starts, forward streaming on for 100-400 ms;
only the part inside the request counts, so both reports said a confident "latency is steady").
When the p95 (:data:`~otel_stages.analysis.caveats.OUTLIVED_PERCENTILE`) over the warm requests of
the time a standard stage span ends after its request reaches the noise band, the verdict is
tentative, the reason first in the evidence and the advice. Each threshold pinned on both sides;
the file report and the ClickHouse report agree."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from otel_stages.analysis import advice
from otel_stages.analysis.caveats import OUTLIVED_PERCENTILE, outlived_caveat
from otel_stages.analysis.decision import decide
from otel_stages.analysis.verdict import Verdict
from tests.test_clickhouse_issues import MS, STABLE, Spans, edited, engine, named, reports, shift
from tests.test_decision import figures, stage

__all__ = ["engine"]  # the module's chDB fixture


@pytest.mark.parametrize(("outlived", "p95_ms", "caveat"), [
    (5, 3.0, True),      # the p95 at the band
    (5, 2.999, False),   # under the band: work after the answer too short to hide a swing
    (0, 3.0, False),     # none outlived (a p95 without them is no reading)
    (100, 400.0, True),
])
def test_a_request_span_closing_before_its_work_makes_the_verdict_tentative(
        outlived: int, p95_ms: float, caveat: bool) -> None:
    assert OUTLIVED_PERCENTILE == 95
    fig = replace(figures(stage("forward", 40.0, explains=0.9), total_swing=40.0, n=100),
                  outlived_requests=outlived, outlived_p95_ms=p95_ms)
    v = Verdict("forward", "forward", ["forward swings"], ["fix forward"])
    outlived_caveat(v, fig, band_ms=3.0)
    assert v.tentative is caveat
    assert (v.advice[0] == advice.END_REQUEST_SPAN) is caveat
    assert ("ends after the request span" in v.evidence[0]) is caveat
    if caveat:
        assert v.evidence[0].startswith(f"in {outlived} of 100 warm requests a stage span ends")


def test_the_rules_apply_the_caveat_to_a_steady_verdict() -> None:
    """Through :func:`decide`: the steady verdict stays, tentative, with the reason first."""
    fig = replace(figures(stage("forward", 40.0, explains=0.9), total_swing=1.0),
                  outlived_requests=30, outlived_p95_ms=200.0)
    v = decide(fig)
    assert v.cause == "stable" and v.tentative
    assert v.advice[0] == advice.END_REQUEST_SPAN
    assert decide(replace(fig, outlived_requests=0, outlived_p95_ms=None)).tentative is False


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


@pytest.mark.parametrize(("count", "caveat"), [(30, True), (3, True), (2, False)])  # 29 warm: 2 or 1
def test_streamed_responses_read_alike_in_both_reports(engine, tmp_path: Path, count: int,
                                                       caveat: bool) -> None:
    got, want = reports(engine, edited(STABLE, tmp_path / f"stream{count}.jsonl", _streamed(count)))
    assert got["verdict"] == want["verdict"]
    v = want["verdict"]
    # (tentative also without it: no forward is slow then, decision._no_slow_forward_caveat)
    assert v["tentative"] or not caveat, v
    assert (v["advice"][0] == advice.END_REQUEST_SPAN) is caveat
    if caveat:
        warm = count - 1  # the first request is cold
        assert v["evidence"][0].startswith(f"in {warm} of 29 warm requests a stage span ends"), v
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


def _short_and_long(i: int, spans: Spans) -> None:
    """Every request streamed: the request span ends 5 ms into forward; forward ends 2 ms after
    it in most requests and 360 ms after it in every fifth."""
    _streamed(30, lambda k: 360.0 if k % 5 == 0 else 2.0)(i, spans)


def test_many_short_overhangs_do_not_hide_the_long_ones(engine, tmp_path: Path) -> None:
    """The second tester's input: a median over the requests that overhang sat under the band
    (most overhang 2 ms), and a fifth of the requests running 360 ms on was a confident
    "steady"; their p95 is not."""
    got, want = reports(engine, edited(STABLE, tmp_path / "short_long.jsonl", _short_and_long))
    assert got["verdict"] == want["verdict"]
    assert want["verdict"]["tentative"] and want["verdict"]["advice"][0] == advice.END_REQUEST_SPAN


def _export_after(i: int, spans: Spans) -> None:
    """A custom ``export_result`` span from 1 ms to 40 ms after the request span ends."""
    request = named(spans, "request")
    end = int(request["endTimeUnixNano"])
    spans.append({**named(spans, "download"), "spanId": f"{i:08x}0000e0e0", "name": "export_result",
                  "startTimeUnixNano": str(end + MS), "endTimeUnixNano": str(end + 40 * MS)})


def test_a_custom_stage_after_the_answer_is_work_after_it(engine, tmp_path: Path) -> None:
    """The second tester's input: an export span in every request, after the response: not the
    request's work, so no caveat (it is named in the problems)."""
    got, want = reports(engine, edited(STABLE, tmp_path / "export.jsonl", _export_after))
    assert got["verdict"] == want["verdict"]
    assert not want["verdict"]["tentative"] and advice.END_REQUEST_SPAN not in want["verdict"]["advice"]


def _timeouts(i: int, spans: Spans) -> None:
    """Requests 5, 10, 15 fail (ERROR) when their forward outlives them by 1.5 s."""
    if i in (5, 10, 15):
        named(spans, "request")["status"] = {"code": 2}
        shift(named(spans, "forward"), 0, 1_500 * MS)


def test_failed_requests_outliving_their_span_do_not_hedge_the_warm_figures(engine, tmp_path: Path) -> None:
    """The second tester's input: timed-out requests whose forward ran on are left out of the
    warm figures, so they leave nothing out of them."""
    got, want = reports(engine, edited(STABLE, tmp_path / "timeouts.jsonl", _timeouts))
    assert got["verdict"] == want["verdict"]
    assert advice.END_REQUEST_SPAN not in want["verdict"]["advice"]
    assert want["counts"]["failed"] == 3
