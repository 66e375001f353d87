"""A figure printed beside a threshold it was compared with never rounds onto or across it
(:func:`otel_stages.analysis.units.times_beside` / ``pct_beside`` / ``round_beside``). A tester's
recording: every warm request 50.12 ms, the first 100.19 ms (1.999x): "no cold-start penalty: first
request ... took 100.2 ms, 2.00x the median", beside a 2x threshold; the JSON said ``ratio`` 2.0."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from otel_stages.analysis import noise
from otel_stages.analysis.decision import COLD_START_MIN_RATIO
from otel_stages.analysis.units import BESIDE_EXTRA_DIGITS, pct_beside, round_beside, times_beside
from tests import odd_inputs
from tests.test_clickhouse_issues import engine, reports  # noqa: F401  (engine: a fixture)


@pytest.mark.parametrize("ratio, text", [
    (12.34, "12.3x"), (2.5, "2.5x"), (1.9, "1.9x"),
    (1.99, "1.99x"), (1.999, "1.999x"), (1.9999, "just under 2x"),  # below: never 2.0x
    (2.0, "2.0x"),  # on it: on it
    (2.01, "2.01x"), (2.001, "2.001x"), (2.0001, "just over 2x"),  # above: never 2.0x either
])
def test_a_ratio_beside_its_threshold(ratio: float, text: str) -> None:
    assert BESIDE_EXTRA_DIGITS == 2
    assert times_beside(ratio, 2.0) == text


@pytest.mark.parametrize("fraction, text", [
    (0.42, "42%"), (0.694, "69%"), (0.695, "69.5%"), (0.6999, "69.99%"), (0.69999, "just under 70%"),
    (0.7, "70%"), (0.7004, "70.04%"), (0.70001, "just over 70%"), (0.099, "9.9%"), (0.0, "0%"),
])
def test_a_percentage_beside_its_threshold(fraction: float, text: str) -> None:
    threshold = 0.1 if fraction < 0.3 else 0.7
    assert pct_beside(fraction, threshold) == text


@pytest.mark.parametrize("value, rounded", [
    (1.9990, 1.999), (1.99999, 1.99999), (2.004, 2.004), (2.0, 2.0), (2.345, 2.35), (1.5, 1.5)])
def test_a_json_figure_beside_its_threshold(value: float, rounded: float) -> None:
    assert round_beside(value, 2.0, 2) == rounded
    assert round_beside(None, 2.0, 2) is None


def _ties(tmp_path: Path) -> Path:
    """The tester's recording: 25 requests of one process, every warm one 50.12 ms, the first
    (cold) 100.19 ms; the request span is its stages plus 0.1 ms."""
    def stages(i: int, _: object) -> list[tuple[str, float]]:
        return [("decode", 10.0), ("resize", 2.0), ("queue", 1.0), ("forward", 87.09 if i == 0 else 37.02)]
    return odd_inputs.write(tmp_path / "ties.jsonl", odd_inputs.run(25, stages))


def test_a_first_request_just_under_the_cold_threshold(engine, tmp_path: Path) -> None:  # noqa: F811
    assert COLD_START_MIN_RATIO == 2.0
    path = _ties(tmp_path)
    got, want = reports(engine, path)
    assert want["verdict"]["cause"] == "stable"
    (line,) = [e for e in want["verdict"]["evidence"] if e.startswith("no cold-start penalty")]
    assert "took 100.2 ms, 1.999x the median" in line, line
    assert want["cold_start"]["ratio"] == got["cold_start"]["ratio"] == 1.999  # not 2.0
    assert got["verdict"] == want["verdict"]
    from otel_stages.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["report", str(path)]) == 0
    text = " ".join(out.getvalue().split())
    assert "100.2 ms, 1.999x the median" in text and "2.00x" not in text and "2.0x" not in text


def test_the_jitter_beside_the_least_swing_it_fell_short_of() -> None:
    # the band is the least swing worth a verdict (15 %) when the jitter is below it: a jitter of
    # 14.96 % said "jitter by 15%" beside "the least swing worth a verdict, 15%"
    band = noise.NoiseBand(15.0, 100.0, 0.1496, 4, "fraction")
    assert "jitter by 14.96% of their own medians" in band.describe()
    capped = noise.NoiseBand(25.0, 100.0, 0.2504, 4, "jitter_cap")
    assert "jitter by 25.04% of their own medians" in capped.describe()
    assert "jitter by 20% of" in noise.NoiseBand(20.0, 100.0, 0.2, 4, "jitter").describe()
