"""A fresh-eyes tester's odd inputs (tests/odd_inputs.py regenerates each file byte for byte):
untraced time as the largest share, stage spans on a skewed clock, conflicting span ids, mostly
failed runs, ``explains`` outside 0..1, stages missing from requests, requests set apart after an
idle gap, cold-start wording, a failed first request. Each rule is pinned just below and above its
threshold on hand-built figures, and each file goes through the real CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_stages.analysis import advice
from otel_stages.analysis.decision import decide, untraced_is_largest
from otel_stages.analysis.figures import UnaccountedFigures
from otel_stages.cli import main
from tests import odd_inputs
from tests.test_decision import figures, stage


def report_of(path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["report", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def text_of(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["report", str(path)]) == 0
    return capsys.readouterr().out


# --- 1. untraced time as the largest share; stage spans on another host's clock ----------------


@pytest.mark.parametrize("gap_share, untraced", [(0.74, False), (0.76, True)])
def test_untraced_time_as_the_largest_share_is_where_to_start(gap_share, untraced):
    # forward is 75 % of the request (test_decision.MEDIANS): the largest share just below / above
    fig = figures(total_swing=2.0, unaccounted=UnaccountedFigures(gap_share * 100, 0.5, gap_share, 0.0))
    assert untraced_is_largest(fig) is untraced
    v = decide(fig)
    assert v.cause == "stable"
    text = " ".join(v.evidence + v.advice)
    if untraced:
        assert "outside the stage spans" in text and f"{round(gap_share * 100)}% is untraced" in text
        assert "start with forward" not in text and advice.UNTRACED_SHARE in v.advice[-1]
    else:
        assert "largest share: forward" in text and "start with forward" in text
        assert "untraced" not in text


def test_untraced_largest_share_is_added_to_a_stage_verdict():
    fig = figures(stage("forward", 40.0, explains=0.9), total_swing=40.0,
                  unaccounted=UnaccountedFigures(80.0, 0.5, 0.8, 0.0))
    v = decide(fig)
    assert v.stage == "forward"
    assert any("most request time lies outside the stage spans" in e for e in v.evidence)
    assert v.advice[-1] == "also: " + advice.UNTRACED_SHARE


def test_clock_skewed_stage_spans_are_named_and_never_the_place_to_start(tmp_path, capsys):
    out = report_of(odd_inputs.clock_skew(tmp_path / "skew.jsonl"), capsys)
    assert out["stages"]["forward"]["median_ms"] == 0.0
    assert out["unaccounted"]["share"] > 0.8
    (skew,) = [p for p in out["problems"] if "entirely outside their request span" in p]
    assert skew.startswith("30 stage spans in 30 requests") and "clock skew between hosts" in skew
    assert "starts 1898.5 ms after the request ended" in skew
    assert not any("reach outside" in p for p in out["problems"])  # not counted twice
    verdict = out["verdict"]
    assert verdict["cause"] == "stable"
    assert any("82% is untraced" in e for e in verdict["evidence"])
    assert not any("start with decode" in a for a in verdict["advice"])
    assert not any("largest share: decode" in e for e in verdict["evidence"])


def test_a_stage_ending_before_its_request_began_is_named_too(tmp_path, capsys):
    path = odd_inputs.write(tmp_path / "back.jsonl",
                            odd_inputs.shift(odd_inputs.run(30), "forward", -1_000_000_000))
    out = report_of(path, capsys)
    assert any("entirely outside" in p and "before the request began" in p for p in out["problems"])


def test_a_stage_sticking_out_is_not_called_clock_skew(tmp_path, capsys):
    # forward moved by 50 ms: still partly inside its request
    path = odd_inputs.write(tmp_path / "part.jsonl",
                            odd_inputs.shift(odd_inputs.run(30), "forward", 50_000_000))
    out = report_of(path, capsys)
    assert any("reach outside their request span in 30 requests" in p for p in out["problems"])
    assert not any("entirely outside" in p for p in out["problems"])


def test_zero_length_stages_point_at_the_untraced_time(tmp_path, capsys):
    out = report_of(odd_inputs.zero_dur(tmp_path / "zero.jsonl"), capsys)
    verdict = out["verdict"]
    assert any("100% is untraced" in e for e in verdict["evidence"])
    assert not any("start with download" in a for a in verdict["advice"])
    assert not any("entirely outside" in p for p in out["problems"])  # 0 ms spans are inside


# --- 2. span ids shared by different spans --------------------------------------------------------


def test_conflicting_span_ids_are_named(tmp_path, capsys):
    out = report_of(odd_inputs.dup_ids_one_trace(tmp_path / "dup.jsonl"), capsys)
    assert out["requests"] == 1
    (clash,) = [p for p in out["problems"] if "share a span id with a different span" in p]
    assert clash.startswith("29 spans share") and "'request' and 'request' starting 224.0 ms apart" in clash
    # the merged request's stages are not blamed on a clock
    assert not any("entirely outside" in p or "reach outside" in p for p in out["problems"])


def test_exact_duplicate_lines_stay_deduplicated_without_a_problem(tmp_path, capsys):
    out = report_of(odd_inputs.dup_lines(tmp_path / "twice.jsonl"), capsys)
    assert out["requests"] == 30 and out["counts"]["warm"] == 29
    assert out["problems"] == []


@pytest.mark.parametrize("change, clash", [
    ({}, False),
    ({"end_ns": 1}, True),
    ({"start_ns": 1, "end_ns": 1}, True),
    ({"parent_span_id": "f" * 16}, True),
    ({"name": "decode"}, True),
])
def test_a_span_id_clash_is_any_difference_in_name_parent_or_times(change, clash):
    from msgspec.structs import replace

    from otel_stages.analysis import Span
    from otel_stages.analysis.requests import group_spans
    from tests.test_verdict import T0_NS

    req = Span("a" * 32, "1" * 16, None, "request", T0_NS, T0_NS + 100_000_000)
    fwd = Span("a" * 32, "2" * 16, "1" * 16, "forward", T0_NS + 10, T0_NS + 90_000_000)
    moved = {k: (getattr(fwd, k) + v if isinstance(v, int) else v) for k, v in change.items()}
    grouping = group_spans([req, fwd, replace(fwd, **moved)])
    assert len(grouping.requests) == 1
    assert any("share" in p and "a span id with a different span" in p
               for p in grouping.problems) is clash
