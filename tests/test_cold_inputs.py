"""Cold requests against what they are compared with, and figures shown only with enough warm
requests, the file report and the ClickHouse report alike (a tester's fleets: cold requests of two
inputs, only cold requests, four warm requests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis.clickhouse import connect, parse_url
from otel_stages.analysis.decision import MIN_WARM_RUNS
from tests import odd_inputs
from tests.test_clickhouse_issues import reports


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    with connect(parse_url(f"chdb:{tmp_path_factory.mktemp('chdb')}")) as eng:
        yield eng


def _processes(path: Path, sizes: list[tuple[int, int]], per_process: int,
               warm: list[tuple[int, int]] | None = None) -> Path:
    """One process per entry of ``sizes``, ``per_process`` requests each; process ``k``'s first
    (cold, 500 ms slower in forward) request has input ``sizes[k]``, the others alternate
    through ``warm`` (default ``sizes``)."""
    lines = []
    warm = warm or sizes
    for k, first in enumerate(sizes):
        rows = odd_inputs.run(per_process, seed=k + 1)
        for i, spans in enumerate(rows):
            w, h = first if i == 0 else warm[i % len(warm)]
            for s in spans:
                if s["name"] == "decode":
                    s["attributes"] += [odd_inputs._attr("image.width", w),
                                        odd_inputs._attr("image.height", h)]
                if i == 0 and s["name"] in ("forward", "request"):
                    s["endTimeUnixNano"] = str(int(s["endTimeUnixNano"]) + 500_000_000)
            resource = {"attributes": [odd_inputs._attr("service.name", "svc"),
                                       odd_inputs._attr("service.instance.id", f"i{k}")]}
            lines.append(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
                {"scope": {"name": "otel_stages"}, "spans": spans}]}]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _same(engine: Any, path: Path) -> dict[str, Any]:
    got, want = reports(engine, path)
    assert got["cold_start"] == want["cold_start"]
    assert got["verdict"] == want["verdict"]
    return want


def test_cold_requests_of_two_inputs_meet_the_warm_requests_of_both(engine, tmp_path: Path) -> None:
    # the SQL compared them with all warm requests and said "fewer than 5 share its input; not
    # comparable", the file report with the union but wrote "(None, ...)"
    want = _same(engine, _processes(tmp_path / "two_inputs.jsonl", [(640, 480), (4000, 3000)], 20))
    cold = want["cold_start"]
    assert cold["compared_with"] == "same_input" and cold["cohort"] is None
    line = next(e for e in want["verdict"]["evidence"] if "cold requests (median)" in e)
    assert "with the same inputs as theirs (" in line and "None" not in line


def test_a_rare_input_of_one_cold_request_leaves_it_out_not_the_others(engine, tmp_path: Path) -> None:
    # a tester's fleet of 8 replicas: one's first request had an input no warm request shares,
    # so no cold request was compared like with like and the 5x cold start was "not called"
    path = _processes(tmp_path / "rare.jsonl", [(640, 480)] * 7 + [(4000, 3000)], 15, [(640, 480)])
    want = _same(engine, path)
    cold = want["cold_start"]
    assert (cold["count"], cold["left_out"], cold["cohort"]) == (7, 1, "640x480")
    assert want["verdict"]["cause"] == "cold_start"
    assert any("(1 more, whose input is unknown or shared by fewer than 5 warm requests, left out"
               in e for e in want["verdict"]["evidence"])


def test_only_cold_requests_are_said_with_nothing_to_compare(engine, tmp_path: Path) -> None:
    # the SQL dropped the cold requests and called the GPU evidence thin over no forward
    got, want = reports(engine, _processes(tmp_path / "only_cold.jsonl", [(640, 480)] * 3, 1))
    assert want["counts"]["warm"] == 0 and want["cold_start"]["count"] == 3
    assert got["cold_start"] == want["cold_start"]
    assert got["verdict"] == want["verdict"]
    assert any("no warm request to compare it with" in e for e in want["verdict"]["evidence"])
    assert got["gpu"]["level"] == want["gpu"]["level"] == "none"


@pytest.mark.parametrize("warm", [MIN_WARM_RUNS - 1, MIN_WARM_RUNS])
def test_explains_is_shown_from_enough_warm_requests(engine, tmp_path: Path, warm: int) -> None:
    # under MIN_WARM_RUNS the file report shows no share of variance (noise); the SQL did
    got, want = reports(engine, _processes(tmp_path / f"warm_{warm}.jsonl", [(640, 480)], warm + 1))
    assert want["counts"]["warm"] == warm
    for report in (got, want):
        shown = [s["explains"] is not None for s in report["stages"].values()]
        assert shown and all(shown) == (warm >= MIN_WARM_RUNS) and any(shown) == all(shown)
        assert (report["unaccounted"]["explains"] is not None) == (warm >= MIN_WARM_RUNS)
