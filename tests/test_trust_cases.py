"""Every handed scenario (tests/data/traces and its trust/ folder, copied from shared/cases) through
the CLI with --json, checked against its answers.json and the further expectations of the trust
README: shares that add up, incomplete counts, stage maxima, cohorts, the cold request's cohort,
per-request span names, and the before/after pairs with --fail-on-regression."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from otel_stages.cli import main

TRACES = Path(__file__).parent / "data" / "traces"
TRUST = TRACES / "trust"
OLD = json.loads((TRACES / "answers.json").read_text())
NEW = json.loads((TRUST / "answers.json").read_text())
PAIRS = NEW.pop("pairs")
SINGLE = [(TRACES, name, OLD[name]) for name in sorted(OLD)] + [
    (TRUST, name, NEW[name]) for name in sorted(NEW)
]
#: The README: stage shares plus unaccounted.share sum to 1 within this range, in every scenario.
SHARES_SUM = (0.98, 1.02)
#: DESIGN.md section 3, every key of the report contract.
CONTRACT = {
    "requests", "counts", "total", "stages", "unaccounted", "cohorts", "input_mix_explains",
    "cold_start", "runs", "problems", "verdict", "comparison",
}
COMPARISON_ROW = {
    "baseline_median_ms", "median_ms", "baseline_p95_ms", "p95_ms", "change_pct",
    "p95_change_pct", "significant",
}


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict]:
    code = main(["report", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _check_contract(out: dict) -> None:
    assert set(out) >= CONTRACT
    assert set(out["counts"]) == {"warm", "cold", "failed", "incomplete"}
    assert out["requests"] == out["counts"]["warm"] + out["counts"]["cold"] + out["counts"]["failed"]
    assert set(out["total"]) >= {"min_ms", "median_ms", "p95_ms", "max_ms", "swing_ms"}
    for stage in out["stages"].values():
        assert set(stage) >= {"min_ms", "median_ms", "p95_ms", "max_ms", "share", "swing_ms",
                              "explains"}
    assert set(out["unaccounted"]) >= {"median_ms", "share"}
    for cohort in out["cohorts"]:
        assert set(cohort) >= {"key", "requests", "median_total_ms", "p95_total_ms", "verdict"}
    for run in out["runs"]:
        assert set(run) >= {"service_name", "service_instance_id", "first_unix_ns", "last_unix_ns",
                            "requests"}
        assert run["first_unix_ns"] <= run["last_unix_ns"]
    assert sum(r["requests"] for r in out["runs"]) == out["requests"]
    verdict = out["verdict"]
    assert set(verdict) >= {"cause", "stage", "evidence", "advice", "tentative"}
    cold = out["cold_start"]
    if cold is not None:
        assert set(cold) >= {"total_ms", "warm_median_total_ms", "comparable_median_total_ms",
                             "compared_with", "ratio", "stages"}
        assert cold["compared_with"] in ("same_input", "all_warm")
        assert cold["ratio"] == pytest.approx(cold["total_ms"] / cold["comparable_median_total_ms"],
                                              abs=0.01)


@pytest.mark.parametrize("folder, name, expected", SINGLE, ids=[n for _, n, _ in SINGLE])
def test_handed_scenario(folder, name, expected, capsys):
    code, out = _run([str(folder / f"{name}.otlp.jsonl")], capsys)
    assert code == 0
    _check_contract(out)
    verdict = out["verdict"]
    assert verdict["cause"] == expected["cause"], verdict["evidence"]
    if expected["stage"]:
        assert verdict["stage"] in expected["stage"], verdict["evidence"]
    else:
        assert verdict["stage"] is None
    assert verdict["evidence"] and verdict["advice"]

    shares = sum(s["share"] for s in out["stages"].values()) + out["unaccounted"]["share"]
    low, high = expected.get("shares_sum", SHARES_SUM)
    assert low <= shares <= high
    if "requests" in expected:
        assert out["requests"] == expected["requests"]
    if "incomplete_min" in expected:
        assert out["counts"]["incomplete"] >= expected["incomplete_min"]
        assert any("incomplete" in p for p in out["problems"])
    if "stage_max_ms" in expected:
        for stage, real_max in expected["stage_max_ms"].items():
            assert out["stages"][stage]["max_ms"] < 10 * real_max
    if expected.get("per_request_names"):
        assert any("per-request" in p for p in out["problems"])
        assert verdict["stage"] is None or "/" not in verdict["stage"]
        assert all("/" not in name for name in out["stages"])
    if "cold_start" in expected:
        want, cold = expected["cold_start"], out["cold_start"]
        assert cold["compared_with"] == want["compared_with"]
        assert cold["ratio"] >= want["min_ratio"]
        assert cold["cohort"] == want["cohort"]
    if "min_cohorts" in expected:
        assert len(out["cohorts"]) >= expected["min_cohorts"]
        assert [c["requests"] for c in out["cohorts"]] == sorted(
            (c["requests"] for c in out["cohorts"]), reverse=True)  # largest first
    if "min_input_mix_explains" in expected:
        assert out["input_mix_explains"] >= expected["min_input_mix_explains"]


def test_the_1970_span_and_the_orphans_are_named(capsys):
    _, out = _run([str(TRUST / "incomplete_traces.otlp.jsonl")], capsys)
    assert any("before 2000-01-01" in p and "1970-01-01" in p for p in out["problems"])
    assert out["counts"]["incomplete"] == 5  # 5 orphan stage spans, each in its own trace


def test_mixed_cold_start_says_the_input_mix_first_with_the_cohort_verdicts(capsys):
    _, out = _run([str(TRUST / "mixed_cold_start.otlp.jsonl")], capsys)
    first = out["verdict"]["evidence"][0]
    assert first.startswith("the input mix explains") and "within the largest cohort" in first
    by_key = {c["key"]: c for c in out["cohorts"]}
    assert by_key["1024x768"]["verdict"]["cause"] == "cold_start"  # within its own input
    assert by_key["4032x3024"]["verdict"]["cause"] == "preprocess"
    cold = out["cold_start"]
    assert cold["total_ms"] < cold["warm_median_total_ms"]  # below the all-warm median...
    assert cold["ratio"] >= 2.5  # ...and far above its own cohort's


@pytest.mark.parametrize("name", sorted(PAIRS))
def test_handed_pair(name, capsys):
    pair = PAIRS[name]
    argv = [str(TRUST / pair["after"]), "--baseline", str(TRUST / pair["baseline"])]
    code, out = _run(argv, capsys)
    assert code == 0
    comparison = out["comparison"]
    assert set(comparison) >= {"total", "stages", "bottleneck_moved", "inputs_differ"}
    assert set(comparison["total"]) >= COMPARISON_ROW
    assert all(set(row) >= COMPARISON_ROW for row in comparison["stages"].values())
    assert comparison["inputs_differ"] is False  # same inputs on both sides
    want = pair["comparison"]
    if "total_significant" in want:
        assert comparison["total"]["significant"] is want["total_significant"]
    if want.get("no_stage_significant"):
        assert not any(row["significant"] for row in comparison["stages"].values())
        assert any(line.startswith("within run-to-run noise") for line in comparison["summary"])
    if "stage" in want:
        row = comparison["stages"][want["stage"]]
        assert row["significant"] is want["significant"]
        if want.get("p95_decreased"):
            assert row["p95_ms"] < row["baseline_p95_ms"]
    if "min_change_pct" in want:
        assert comparison["total"]["change_pct"] >= want["min_change_pct"]
    if "fail_on_regression_10_exit" in pair:
        assert main(["report", *argv, "--json", "--fail-on-regression", "10"]) == (
            pair["fail_on_regression_10_exit"])
        err = capsys.readouterr().err
        assert ("otel-stages: regression: total" in err) is (pair["fail_on_regression_10_exit"] == 3)
