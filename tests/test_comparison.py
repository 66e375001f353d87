"""Before/after with run-to-run noise: bootstrap intervals of median, p95 and swing, the drift
margin, too few samples, inputs that differ, and the --fail-on-regression CI gate."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from otel_stages.analysis import diagnose, load_paths
from otel_stages.analysis.change import MAX_SAMPLES, compare_samples
from otel_stages.analysis.comparison import INPUTS_DIFFER_MIN, cohort_distance
from otel_stages.cli import main
from otel_stages.render import render_text
from tests.test_cohorts import SMALL, mixed, recording

TRUST = Path(__file__).parent / "data" / "traces" / "trust"


def draws(n: int, centre: float, spread: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [centre * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_two_draws_of_one_distribution_are_within_noise():
    change = compare_samples(draws(30, 100, 0.2, 1), draws(30, 100, 0.2, 2))
    assert not change.significant
    assert change.median_ci is not None and change.median_ci.low_ms < 0 < change.median_ci.high_ms


def test_a_real_shift_is_significant_and_reproducible():
    before, after = draws(30, 100, 0.05, 1), draws(30, 130, 0.05, 2)
    a, b = compare_samples(before, after), compare_samples(before, after)
    assert a.significant and a.significant_of("median") and a.significant_of("p95")
    assert a.median_ci == b.median_ci  # fixed seed: the same report twice
    assert a.to_dict()["change_pct"] == pytest.approx(30, abs=3)


def test_a_modest_shift_in_noisy_runs_needs_95_percent_confidence():
    # +18 % on +-30 % noise, 30 requests a side: a 50 % interval would call it, 95 % does not
    change = compare_samples(draws(30, 100, 0.3, 1), draws(30, 118, 0.3, 2))
    assert not change.significant
    assert change.median_ci is not None and change.median_ci.low_ms < change.median_ci.margin_ms
    assert compare_samples(draws(30, 100, 0.3, 1), draws(30, 140, 0.3, 2)).significant


@pytest.mark.parametrize("factor, significant", [(1.08, False), (1.12, True)])  # RUN_DRIFT 10 %
def test_a_change_must_beat_drift_between_runs(factor, significant):
    # almost no noise within each run: only the drift margin decides
    before = draws(40, 100, 0.002, 1)
    after = [v * factor for v in draws(40, 100, 0.002, 2)]
    change = compare_samples(before, after)
    assert change.significant_of("median") is significant
    assert change.median_ci is not None and change.median_ci.margin_ms == pytest.approx(
        0.1 * change.baseline_median_ms)


@pytest.mark.parametrize("n, tested", [(4, False), (5, True)])  # MIN_SAMPLES 5
def test_too_few_requests_are_never_significant(n, tested):
    change = compare_samples(draws(n, 100, 0.01, 1), draws(n, 300, 0.01, 2))
    assert (change.median_ci is not None) is tested
    assert change.significant is tested


def test_large_samples_are_subsampled_not_refused():
    assert MAX_SAMPLES < 2500
    change = compare_samples(draws(2500, 100, 0.1, 1), draws(2500, 150, 0.1, 2))
    assert change.significant and change.count == 2500


@pytest.mark.parametrize("moved, differ", [(0.19, False), (0.21, True)])  # INPUTS_DIFFER_MIN 0.2
def test_inputs_differ_by_total_variation_distance(moved, differ):
    before = {"a": 1000}
    after = {"a": round(1000 * (1 - moved)), "b": round(1000 * moved)}
    assert cohort_distance(before, after) == pytest.approx(moved)
    assert (cohort_distance(before, after) >= INPUTS_DIFFER_MIN) is differ
    assert cohort_distance({}, after) is None


def test_comparison_warns_when_the_inputs_differ():
    only_small = recording([(SMALL, 200.0, 0.0)] + [(SMALL, 50.0 + i % 3, 0.0) for i in range(25)])
    report = diagnose(mixed(), baseline=only_small)
    assert report.comparison is not None and report.comparison.inputs_differ
    assert any(s.startswith("the inputs differ") for s in report.comparison.summary)
    same = diagnose(mixed(), baseline=mixed())
    assert same.comparison is not None and not same.comparison.inputs_differ
    assert same.comparison.within_noise


def test_text_shows_p95_and_which_changes_are_noise():
    report = diagnose(load_paths([TRUST / "pair_decode_tail.after.otlp.jsonl"]),
                      baseline=load_paths([TRUST / "pair_decode_tail.before.otlp.jsonl"]))
    out = render_text(report, width=120)
    decode = next(line for line in out.splitlines() if line.strip().startswith("decode")
                  and "72.6" in line)
    assert decode.split()[-1] == "yes" and "34.3" in decode
    forward = [line for line in out.splitlines() if line.strip().startswith("forward")][-1]
    assert forward.split()[-1] == "noise"
    assert "decode: p95 72.6 ms -> 34.3 ms" in out


# --- --fail-on-regression -------------------------------------------------------------------------


def _pair(name: str) -> list[str]:
    return [str(TRUST / f"{name}.after.otlp.jsonl"), "--baseline", str(TRUST / f"{name}.before.otlp.jsonl")]


@pytest.mark.parametrize("pct, code", [(37, 3), (40, 0), ("10%", 3)])
def test_fail_on_regression_threshold(pct, code, capsys):
    # pair_regression: total median +37.7 %, p95 +39.4 %, both beyond noise
    assert main(["report", *_pair("pair_regression"), "--fail-on-regression", str(pct)]) == code
    err = capsys.readouterr().err
    assert ("otel-stages: regression: total median" in err) is (code == 3 and pct != 40)


def test_an_improvement_or_noise_never_trips_the_gate(capsys):
    assert main(["report", *_pair("pair_decode_tail"), "--fail-on-regression", "0"]) == 0
    assert main(["report", *_pair("pair_noise"), "--fail-on-regression", "0"]) == 0  # +122 % median


@pytest.mark.parametrize("argv, message", [
    (["--fail-on-regression", "10"], "give --baseline PATH"),
    (["--fail-on-regression", "-1", "--baseline", "x"], "a percentage of 0 or more"),
    (["--fail-on-regression", "ten", "--baseline", "x"], "expected a percentage"),
])
def test_fail_on_regression_usage(argv, message, capsys):
    path = str(TRUST / "pair_noise.after.otlp.jsonl")
    with pytest.raises(SystemExit) as exit_info:
        code = main(["report", path, *argv])
        raise SystemExit(code)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_comparison_json_has_the_contract_keys(capsys):
    assert main(["report", *_pair("pair_noise"), "--json"]) == 0
    comparison = json.loads(capsys.readouterr().out)["comparison"]
    assert comparison["within_noise"] is True and comparison["bottleneck_moved"] is False
    total = comparison["total"]
    assert total["median_ci_ms"][0] < 0 < total["median_ci_ms"][1]
    assert set(total["margins_ms"]) == {"median", "p95", "swing"}


# --- the whole host moved -------------------------------------------------------------------------


def _rows(ratios: dict[str, float]) -> dict:
    from otel_stages.analysis.change import Change

    base = {"download": 5.0, "decode": 10.0, "resize": 5.0, "queue": 5.0, "forward": 75.0}
    return {n: Change(m, m * ratios.get(n, 1.0)) for n, m in base.items()}


@pytest.mark.parametrize("ratios, uniform", [
    ({"download": 2.0, "decode": 2.1, "resize": 1.9, "queue": 2.5, "forward": 2.2}, True),
    ({"download": 0.5, "decode": 0.6, "resize": 0.55, "queue": 0.5, "forward": 0.45}, True),
    ({"forward": 1.45}, False),  # one stage: a change in one place
    ({"download": 1.5, "decode": 1.5, "resize": 1.5, "queue": 1.5, "forward": 2.9}, True),
    ({"download": 1.5, "decode": 1.5, "resize": 1.5, "queue": 1.5, "forward": 3.1}, False),  # spread > 2
    ({"download": 1.08, "decode": 2.0, "resize": 2.0, "queue": 2.0, "forward": 2.0}, False),  # one within drift
])
def test_uniform_shift_points_at_the_host(ratios, uniform):
    from otel_stages.analysis.comparison import uniform_ratios

    assert (uniform_ratios(_rows(ratios), 100.0) is not None) is uniform


@pytest.mark.parametrize("stages, uniform", [(2, False), (3, True)])  # UNIFORM_MIN_STAGES 3
def test_uniform_shift_needs_three_stages(stages, uniform):
    from otel_stages.analysis.comparison import uniform_ratios

    rows = {n: c for n, c in list(_rows({n: 2.0 for n in ("download", "decode", "resize",
                                                           "queue", "forward")}).items())[:stages]}
    assert (uniform_ratios(rows, 25.0) is not None) is uniform


def test_a_host_wide_slowdown_is_called_out(capsys):
    from tests.test_verdict import build, steady

    before = build(steady(30))
    after = build([{k: v * 2 for k, v in row.items()} for row in steady(30, seed=2)])
    report = diagnose(after, baseline=before)
    assert report.comparison is not None and report.comparison.uniform_shift
    assert report.comparison.total.significant
    assert report.comparison.summary[0].startswith("every stage moved the same way, by x2.0")
    regression = diagnose(load_paths([TRUST / "pair_regression.after.otlp.jsonl"]),
                          baseline=load_paths([TRUST / "pair_regression.before.otlp.jsonl"]))
    assert regression.comparison is not None and not regression.comparison.uniform_shift


# --- too few requests to test: never "within noise", and the gate does not pass ---------------------


def _first_requests(src: Path, dst: Path, count: int) -> None:
    """``src`` (OTLP/JSON lines as the collector's file exporter writes them) cut to its first
    ``count`` traces by start time, every span of each kept, under the same resources."""
    objs = [json.loads(line) for line in src.read_text().splitlines() if line.strip()]
    starts: dict[str, int] = {}
    for o in objs:
        for rs in o.get("resourceSpans", []):
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    t = int(sp["startTimeUnixNano"])
                    starts[sp["traceId"]] = min(t, starts.get(sp["traceId"], t))
    keep = set(sorted(starts, key=starts.__getitem__)[:count])
    with dst.open("w") as out:
        for o in objs:
            if "resourceSpans" not in o:
                continue
            for rs in o["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    ss["spans"] = [sp for sp in ss["spans"] if sp["traceId"] in keep]
            out.write(json.dumps(o) + "\n")


def _thin_pair(tmp_path: Path, warm: int) -> list[str]:
    """pair_regression (total median +37.7 %, beyond noise with all its requests) cut to the cold
    request and ``warm`` warm ones on each side."""
    paths = []
    for side in ("after", "before"):
        dst = tmp_path / f"{side}.otlp.jsonl"
        _first_requests(TRUST / f"pair_regression.{side}.otlp.jsonl", dst, warm + 1)
        paths.append(str(dst))
    return [paths[0], "--baseline", paths[1]]


@pytest.mark.parametrize("warm, tested", [(4, False), (5, True)])  # MIN_SAMPLES 5
def test_thin_data_is_not_tested_rather_than_within_noise(tmp_path, capsys, warm, tested):
    assert main(["report", *_thin_pair(tmp_path, warm), "--json"]) == 0
    comparison = json.loads(capsys.readouterr().out)["comparison"]
    assert comparison["tested"] is tested
    assert comparison["within_noise"] is False  # untested: not judged; tested: a real change
    not_tested = [s for s in comparison["summary"] if s.startswith("not tested")]
    assert bool(not_tested) is (not tested)
    judged = any(s.startswith("within run-to-run noise") for s in comparison["summary"])
    assert judged is tested  # untested: no row is called noise; tested: the quiet stages are
    assert not any("None" in s for s in comparison["summary"])


@pytest.mark.parametrize("warm, code", [(4, 4), (5, 3)])  # EXIT_UNTESTED 4, EXIT_REGRESSION 3
def test_the_gate_fails_when_it_cannot_judge(tmp_path, capsys, warm, code):
    assert main(["report", *_thin_pair(tmp_path, warm), "--fail-on-regression", "10"]) == code
    err = capsys.readouterr().err
    assert ("cannot judge: too few warm requests (4 before, 4 after" in err) is (code == 4)
