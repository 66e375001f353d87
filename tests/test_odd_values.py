"""Attribute and metric values a producer can write that the report must survive (a fresh-eyes
tester's crash and wrong-unit inputs, rebuilt here): NaN, infinite, huge or fractional image
attributes are absent, never a crash; a metric declared in ``%`` is read as a ratio; a
utilization series over 1 is percent."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from otel_stages.analysis import gpu_owners
from otel_stages.analysis.decision import decide
from otel_stages.analysis.figures import Figures, UnaccountedFigures
from otel_stages.analysis.otlp_json import PERCENT_SCALE, PERCENT_UNIT, parse_export_request
from otel_stages.analysis.requests import INT64_MAX, INT64_MIN, usable_int
from otel_stages.cli import main
from tests import odd_inputs
from tests.test_decision import figures, stage


@pytest.mark.parametrize("value, expected", [
    (1920, 1920), (INT64_MAX, INT64_MAX), (INT64_MAX + 1, None), (INT64_MIN, INT64_MIN),
    (INT64_MIN - 1, None), (1920.0, 1920), (1920.5, None), (math.nan, None), (math.inf, None),
    (-math.inf, None), (1e300, None), (2.0**63, None), (True, None), ("1920", 1920), (" 1920", None),
    ("1920.0", None), (None, None),
])
def test_usable_int_takes_int64_whole_numbers_only(value, expected):
    assert usable_int(value) == expected


_KEYS = ("image.width", "image.height", "image.size")


def _with_decode_attr(tmp_path: Path, name: str, value: dict, key: str = "image.size") -> Path:
    """The tester's steady pipeline (30 requests); every decode span carries image attributes,
    and request 7's ``key`` is ``value`` (an OTLP AnyValue)."""
    rows = odd_inputs.run(30)
    for i, spans in enumerate(rows):
        decode = next(s for s in spans if s["name"] == "decode")
        decode["attributes"] = [odd_inputs._attr("image.width", 640), odd_inputs._attr("image.height", 480),
                                odd_inputs._attr("image.size", 50_000)]
        if i == 7:
            decode["attributes"][_KEYS.index(key)] = {"key": key, "value": value}
    return odd_inputs.write(tmp_path / name, rows)


def _report(path: Path, capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["report", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("key", _KEYS)
@pytest.mark.parametrize("value", [
    {"doubleValue": "NaN"}, {"doubleValue": "Infinity"}, {"doubleValue": "-Infinity"},
    {"doubleValue": 1e300}, {"intValue": str(2**70)}, {"doubleValue": 50000.5},
])
def test_an_unusable_image_attribute_is_absent_not_a_crash(tmp_path, capsys, key, value):
    # NaN / Infinity raised ValueError / OverflowError out of the whole report; a huge width
    # overflowed the draft estimate
    clean = _report(_with_decode_attr(tmp_path, "clean.jsonl", {"intValue": "50000"}, key), capsys)
    odd = _report(_with_decode_attr(tmp_path, "odd.jsonl", value, key), capsys)
    assert odd["verdict"]["cause"] == clean["verdict"]["cause"]
    assert odd["verdict"]["stage"] == clean["verdict"]["stage"]
    assert odd["requests"] == clean["requests"] == 30


def _metric(unit: str, values: list[float], *, as_int: bool = False) -> dict:
    points = [{"timeUnixNano": str(odd_inputs.BASE_NS + i * 10**8),
               "attributes": [odd_inputs._attr("hw.id", "GPU-0")],
               **({"asInt": str(int(v))} if as_int else {"asDouble": v})} for i, v in enumerate(values)]
    return {"resourceMetrics": [{"resource": {"attributes": [odd_inputs._attr("service.name", "svc")]},
                                 "scopeMetrics": [{"metrics": [{"name": "hw.gpu.utilization", "unit": unit,
                                                                "gauge": {"dataPoints": points}}]}]}]}


@pytest.mark.parametrize("unit, scale", [(PERCENT_UNIT, PERCENT_SCALE), ("1", 1.0), ("", 1.0)])
def test_a_metric_declared_in_percent_is_read_as_a_ratio(unit, scale):
    recording = parse_export_request(_metric(unit, [50.0, 1.0, 0.75]))
    assert [p.value for p in recording.metrics] == pytest.approx([50.0 * scale, 1.0 * scale, 0.75 * scale])
    ints = parse_export_request(_metric(unit, [0, 1], as_int=True))
    assert [p.value for p in ints.metrics] == pytest.approx([0.0, 1.0 * scale])
    assert {p.unit for p in recording.metrics} == {unit}  # kept for the ambiguity rule


def test_a_metric_without_a_unit_key_reads_as_undeclared():
    doc = _metric("", [0, 1], as_int=True)
    del doc["resourceMetrics"][0]["scopeMetrics"][0]["metrics"][0]["unit"]
    assert {p.unit for p in parse_export_request(doc).metrics} == {gpu_owners.UNDECLARED_UNIT}


def test_a_series_over_one_is_percent_and_one_is_a_ratio():
    # a ratio never exceeds 1: the guess sits at 1.0 (it was 1.5, which read 1.2 % as 120 %)
    assert gpu_owners.PERCENT_GUESS == 1.0


def _gpu_run(tmp_path: Path, unit: str, value: float) -> Path:
    """Forwards swinging 100..400 ms, the GPU sampled every 20 ms at ``value`` in ``unit``."""
    def swing(i, r):
        return [("download", 5.0), ("decode", 10.0), ("resize", 4.0), ("queue", 2.0),
                ("forward", 100.0 + 300.0 * (i % 3 == 0) + r.random())]
    rows = odd_inputs.run(40, swing)
    path = odd_inputs.write(tmp_path / f"gpu_{unit or 'none'}_{value}.jsonl", rows)
    first = min(int(s["startTimeUnixNano"]) for spans in rows for s in spans)
    last = max(int(s["endTimeUnixNano"]) for spans in rows for s in spans)
    points = [{"timeUnixNano": str(t), "attributes": [odd_inputs._attr("hw.id", "GPU-0")], "asDouble": value}
              for t in range(first, last, 20_000_000)]
    doc = {"resourceMetrics": [{"resource": {"attributes": [odd_inputs._attr("service.name", "svc"),
                                                           odd_inputs._attr("service.instance.id", "i1")]},
                                "scopeMetrics": [{"metrics": [{"name": "hw.gpu.utilization", "unit": unit,
                                                               "gauge": {"dataPoints": points}}]}]}]}
    with path.open("a") as f:
        f.write(json.dumps(doc) + "\n")
    return path


@pytest.mark.parametrize("unit, value, cause", [
    ("%", 1.0, "gpu_starved"),     # DCGM-style percent of an idle GPU (was read as 100 % busy)
    ("%", 95.0, "gpu_busy"),
    ("1", 0.95, "gpu_busy"),
    ("1", 1.2, "gpu_starved"),     # over 1 cannot be a ratio: percent (was 120 %, busy)
    ("1", 1.0, "gpu_busy"),        # declared: a saturated GPU, never ambiguous
    ("", 0.95, "gpu_busy"),        # undeclared, fractional: a ratio
    ("", 95.0, "gpu_busy"),        # undeclared, over 1: percent
])
def test_the_gpu_verdict_reads_the_declared_unit(tmp_path, capsys, unit, value, cause):
    report = _report(_gpu_run(tmp_path, unit, value), capsys)
    assert report["verdict"]["cause"] == cause


# --- an undeclared series of only 0 and 1: ratio or integer percent cannot be told apart ---------


def _dcgm_run(tmp_path: Path, unit: str | None, inside: float, outside: float,
              first: float | None = None) -> Path:
    """:func:`_gpu_run`'s requests (a third of the forwards 400 ms, the rest 100 ms) with the GPU
    sampled every 20 ms as integers (``asInt``, dcgm-exporter's DCGM_FI_DEV_GPU_UTIL through the
    prometheus receiver) where whole, ``inside`` during the forwards and ``outside`` between them;
    ``first``: the first point's value instead (it lies before the first forward). ``unit``
    ``None``: the metric has no ``unit`` key."""
    def swing(i, r):
        return [("download", 5.0), ("decode", 10.0), ("resize", 4.0), ("queue", 2.0),
                ("forward", 100.0 + 300.0 * (i % 3 == 0) + r.random())]
    rows = odd_inputs.run(40, swing)
    path = odd_inputs.write(tmp_path / "dcgm.jsonl", rows)
    windows = [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))
               for spans in rows for s in spans if s["name"] == "forward"]
    lo = min(int(s["startTimeUnixNano"]) for spans in rows for s in spans)
    hi = max(int(s["endTimeUnixNano"]) for spans in rows for s in spans)
    points = []
    for t in range(lo, hi, 20_000_000):
        v = inside if any(s <= t <= e for s, e in windows) else outside
        if t == lo and first is not None:
            v = first
        number = {"asInt": str(int(v))} if float(v).is_integer() else {"asDouble": v}
        points.append({"timeUnixNano": str(t), "attributes": [odd_inputs._attr("hw.id", "GPU-0")],
                       **number})
    metric = {"name": "hw.gpu.utilization", "gauge": {"dataPoints": points},
              **({} if unit is None else {"unit": unit})}
    doc = {"resourceMetrics": [{"resource": {"attributes": [odd_inputs._attr("service.name", "svc"),
                                                           odd_inputs._attr("service.instance.id", "i1")]},
                                "scopeMetrics": [{"metrics": [metric]}]}]}
    with path.open("a") as f:
        f.write(json.dumps(doc) + "\n")
    return path


#: The problem line's start (gpu_owners.ambiguous_unit_lines).
AMBIGUOUS = "hw.gpu.utilization without a declared unit reads only whole numbers not above 1"


@pytest.mark.parametrize("unit", [None, ""])
def test_an_idle_gpu_in_undeclared_integer_percent_is_not_called_busy(tmp_path, capsys, unit):
    """dcgm-exporter's GPU_UTIL (integer percent, no unit) of a near-idle GPU: 1 during the
    forwards, 0 between. Read as a ratio it was 100 % during the forwards: gpu_busy. Ratio and
    percent cannot be told apart, so the series is left out and the report says why, once."""
    report = _report(_dcgm_run(tmp_path, unit, 1, 0), capsys)
    assert report["verdict"]["cause"] not in ("gpu_busy", "gpu_starved")
    assert report["gpu"]["level"] == "none"
    lines = [p for p in report["problems"] if p.startswith(AMBIGUOUS)]
    assert lines == [
        f"{AMBIGUOUS}, some 1, in all the undeclared points of 1 sending process (1 series, e.g."
        " service.name=svc,service.instance.id=i1 hw.id GPU-0): a ratio (an idle or saturated GPU) and integer"
        " percent (a near-idle GPU, as dcgm-exporter's DCGM_FI_DEV_GPU_UTIL) cannot be told"
        " apart (one producer writes one unit, so each sender is judged on all its GPUs), so"
        " they are left out of the GPU evidence."
        " Declare the unit: '1' for a ratio, '%' for percent (e.g. the Collector's transform"
        ' processor: set(metric.unit, "%") where metric.name == "hw.gpu.utilization")']


@pytest.mark.parametrize("unit, first, cause", [
    ("", 0.5, "gpu_busy"),        # one fractional value: a ratio again (1 = 100 %)
    ("", 2, "gpu_starved"),       # one value above PERCENT_GUESS: percent (1 = 1 %)
    ("1", None, "gpu_busy"),      # declared ratio, as our NVML sampler writes 1.0 / 0.0
    ("%", None, "gpu_starved"),   # declared percent
])
def test_the_same_zeros_and_ones_are_judged_when_the_unit_can_be_told(tmp_path, capsys, unit,
                                                                       first, cause):
    report = _report(_dcgm_run(tmp_path, unit, 1, 0, first), capsys)
    assert report["verdict"]["cause"] == cause
    assert not any(p.startswith(AMBIGUOUS) for p in report["problems"])


def test_a_declared_ratio_of_an_idle_gpu_reading_exactly_zero_is_starved(tmp_path, capsys):
    report = _report(_dcgm_run(tmp_path, "1", 0.0, 0.0), capsys)
    assert report["verdict"]["cause"] == "gpu_starved"


# --- a stage whose spans were lost in some requests (tester: the slow requests' forward spans) --


def _lost_forward(count: int) -> Figures:
    fwd = replace(stage("forward", 7.0, explains=-0.4), count=count)
    return figures(fwd, total_swing=257.0, unaccounted=UnaccountedFigures(0.3, 354.0, 0.38, 1.4),
                   per_request=True)


@pytest.mark.parametrize("count, partial", [(26, True), (27, False)])  # 0.9 of 30 warm requests
def test_a_stage_lost_from_some_requests_is_not_a_trade_off(count, partial):
    """forward missing from the slow requests counts 0 ms there: its negative 'explains' is the
    loss, not stages offsetting each other, and the untraced time is most likely the lost spans'
    (was: 'held steady by the trade-off' and 'wrap the untraced work')."""
    v = decide(_lost_forward(count))
    text = " ".join(v.evidence)
    assert ("counted as 0 ms in the warm requests without it" in text) is partial
    assert ("offset each other" in text) is not partial
    assert ("forward spans are missing from some warm requests" in v.advice[0]) is partial
