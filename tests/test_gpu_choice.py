"""Which GPU is the model's when a process reads several (otel_stages.analysis.gpu.pick_gpu), the
file report and the ClickHouse SQL alike: a GPU that rises with the forwards is the model's; when
none rises (a node exporter's other GPUs, a saturated service with no sample outside the
forwards) and their levels differ, no GPU is taken and the evidence is thin, not decided by
``hw.id`` order or a neighbour's load."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import gpu
from otel_stages.analysis.advice import GPU_UNIDENTIFIED
from otel_stages.analysis.clickhouse import connect, parse_url
from otel_stages.analysis.gpu import MIN_MODEL_GPU_RISE, MIN_RISE_STANDARD_ERRORS
from tests.test_clickhouse_issues import MS, _gpu_sender, _host_run, _slow_every, _span_range, reports


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    with connect(parse_url(f"chdb:{tmp_path_factory.mktemp('chdb')}")) as eng:
        yield eng


def _forwards(path: Path) -> list[tuple[int, int]]:
    """The forward windows (ns) of the spans in ``path``, in time order."""
    out = []
    for line in path.read_text().splitlines():
        for rs in json.loads(line).get("resourceSpans", ()):
            for ss in rs["scopeSpans"]:
                out += [(int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]))
                        for s in ss["spans"] if s["name"] == "forward"]
    return sorted(out)


def _node(path: Path, gpus: dict[str, Callable[[int, bool], float]], *, saturated: bool) -> None:
    """30 requests of one process on node-a (every seventh forward slow) and a node exporter on
    node-a reading ``gpus`` (``hw.id`` -> value at time t, inside a warm forward or not) every
    20 ms; ``saturated``: only at instants inside warm forwards (no sample outside them, as in a
    service whose forwards run back to back)."""
    _, first, last = _host_run(path, "i1", "node-a")
    forwards = _forwards(path)
    warm = forwards[1:]  # the first request is the process's cold one
    for hw, level in gpus.items():
        times = [t for t in range(first, last, 20 * MS)
                 if not saturated or any(s <= t <= e for s, e in warm)]
        _gpu_sender(path, [("service.name", "dcgm"), ("host.name", "node-a")], hw, times,
                    lambda t, level=level: level(t, any(s <= t <= e for s, e in warm)))


def _flat(value: float) -> Callable[[int, bool], float]:
    return lambda t, inside: value


def _both(engine: Any, path: Path) -> dict[str, Any]:
    """The file report, after checking that the ClickHouse report gives the same verdict and GPU."""
    got, want = reports(engine, path)
    assert got["verdict"] == want["verdict"]
    assert got["gpu"] == want["gpu"]
    return want


@pytest.mark.parametrize("model, neighbour", [("0", "3"), ("3", "0")])
def test_a_saturated_node_of_flat_gpus_at_different_levels_gives_no_verdict(
        engine, tmp_path: Path, model: str, neighbour: str) -> None:
    # a tester's shape of a saturated shared node: the model's GPU at 15 %, another tenant's at
    # 95 %, every sample inside a forward. The rise was the mean itself (no sample outside), so
    # the busy neighbour was taken (gpu_busy); with both at rise 0, hw.id order decided
    path = tmp_path / f"saturated_{model}.jsonl"
    _node(path, {model: _flat(0.15), neighbour: _flat(0.95)}, saturated=True)
    want = _both(engine, path)
    assert want["verdict"]["cause"] == "forward"
    assert want["gpu"]["level"] == "thin" and want["gpu"]["unidentified_processes"] == 1
    line = next(e for e in want["verdict"]["evidence"] if "cannot be told" in e)
    assert "hw.id 0 " in line and "hw.id 3 " in line and "15%" in line and "95%" in line
    assert want["verdict"]["advice"][0] == GPU_UNIDENTIFIED


def test_flat_gpus_at_one_level_still_judge_the_gpu(engine, tmp_path: Path) -> None:
    # which GPU is the model's cannot be told, but every candidate gives the same level
    path = tmp_path / "same_level.jsonl"
    _node(path, {"0": _flat(0.9), "3": _flat(0.95)}, saturated=True)
    want = _both(engine, path)
    assert want["verdict"]["cause"] == "gpu_busy"
    assert want["gpu"]["unidentified_processes"] == 0


def test_one_gpu_of_a_saturated_service_is_the_models(engine, tmp_path: Path) -> None:
    path = tmp_path / "one_gpu.jsonl"
    _node(path, {"0": _flat(0.15)}, saturated=True)
    want = _both(engine, path)
    assert want["verdict"]["cause"] == "gpu_starved"


@pytest.mark.parametrize("rise, cause", [
    (0.005, "gpu_starved"),   # MIN_MODEL_GPU_RISE: rises with the forwards, the model's GPU
    (0.0045, "forward"),      # below it: as flat as the busy neighbour
])
def test_the_least_rise_that_tells_the_models_gpu(engine, tmp_path: Path, rise: float,
                                                  cause: str) -> None:
    assert MIN_MODEL_GPU_RISE == 0.005  # the cases sit just below and at it
    path = tmp_path / f"rise_{rise}.jsonl"
    _node(path, {"0": lambda t, inside: rise if inside else 0.0, "3": _flat(0.95)}, saturated=False)
    want = _both(engine, path)
    assert want["verdict"]["cause"] == cause
    assert want["gpu"]["unidentified_processes"] == (cause == "forward")


def test_a_process_left_out_is_said_beside_the_evidence_of_the_others(engine, tmp_path: Path) -> None:
    # node-a's GPUs cannot be told apart; node-b's one GPU is busy in the slow forwards
    path = tmp_path / "two_nodes.jsonl"
    _node(path, {"0": _flat(0.15), "3": _flat(0.95)}, saturated=True)
    slow, first, last = _host_run(path, "i2", "node-b", seed=2)
    _gpu_sender(path, [("service.name", "dcgm"), ("host.name", "node-b")], "0",
                range(first, last, 20 * MS),
                lambda t: 0.95 if any(s <= t <= e for s, e in slow) else 0.3)
    want = _both(engine, path)
    assert want["gpu"]["unidentified_processes"] == 1 and want["gpu"]["samples"] > 0
    assert any("left out: 1 process reads 2 GPUs" in e for e in want["verdict"]["evidence"])


def test_a_noisy_neighbour_does_not_rise_by_chance(engine, tmp_path: Path) -> None:
    # a tester's node: the model's GPU busy all the time (94 % inside and outside the forwards,
    # rise 0), another tenant's wandering between 0 and 30 % and a point higher inside the
    # forwards: above MIN_MODEL_GPU_RISE, so it was taken (gpu_starved at 16 %)
    noise = random.Random(3)
    path = tmp_path / "noisy.jsonl"
    _node(path, {"0": _flat(0.94),
                 "3": lambda t, inside: noise.uniform(0.0, 0.3) + (0.01 if inside else 0.0)},
          saturated=False)
    want = _both(engine, path)
    assert want["verdict"]["cause"] == "forward" and want["gpu"]["unidentified_processes"] == 1


def test_two_gpus_rising_at_different_levels_give_no_gpu(engine, tmp_path: Path) -> None:
    # a tester's node: a shadow replica fed the same traffic rises with the forwards too (4 % ->
    # 94 %) beside the model's own GPU (1 % -> 14 %): the greater rise was taken (gpu_busy)
    path = tmp_path / "shadow.jsonl"
    _node(path, {"0": lambda t, inside: 0.14 if inside else 0.01,
                 "1": lambda t, inside: 0.94 if inside else 0.04}, saturated=False)
    want = _both(engine, path)
    assert want["verdict"]["cause"] == "forward" and want["gpu"]["unidentified_processes"] == 1


@pytest.mark.parametrize("low, rises", [(0.1, True), (0.0999, False)])
def test_a_rise_of_three_standard_errors(low: float, rises: bool) -> None:
    # inside the forwards 0.5 and ``low`` alternating, outside 0: the rise is the inside mean,
    # its standard error half the inside spread; at low 0.1 exactly MIN_RISE_STANDARD_ERRORS (3)
    assert MIN_RISE_STANDARD_ERRORS == 3.0
    samples = [(10, 0.5), (20, low), (30, 0.5), (40, low), (110, 0.0), (120, 0.0), (130, 0.0), (140, 0.0)]
    aligned = gpu._align("0", samples, [(0, 50)], None)
    assert gpu.rises(aligned) is rises


def test_the_slow_forwards_of_a_process_left_out_are_not_judged_by_the_others(
        engine, tmp_path: Path) -> None:
    # a tester's 8-GPU node: the process whose GPU cannot be told holds the slow forwards; the
    # others' fast forwards (busy) decided gpu_busy, "judged on all forwards"
    path = tmp_path / "left_out_slow.jsonl"
    _node(path, {"0": _flat(0.15), "3": _flat(0.95)}, saturated=True)  # node-a: slow forwards
    rows = _slow_every(0, seed=5)  # node-b: no slow forward, its one GPU busy in every forward
    from tests import odd_inputs

    resource = {"attributes": [odd_inputs._attr("service.name", "svc"),
                               odd_inputs._attr("service.instance.id", "i2"),
                               odd_inputs._attr("host.name", "node-b")]}
    with path.open("a") as f:
        for spans in rows:
            f.write(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
                {"scope": {"name": "otel_stages"}, "spans": spans}]}]}) + "\n")
    first, last = _span_range(rows)
    _gpu_sender(path, [("service.name", "dcgm"), ("host.name", "node-b")], "0",
                range(first, last, 20 * MS), lambda t: 0.95)
    want = _both(engine, path)
    assert want["gpu"]["samples"] > 0 and want["gpu"]["unidentified_processes"] == 1
    assert want["gpu"]["level"] == "thin" and want["verdict"]["cause"] == "forward"
    assert want["verdict"]["advice"][0] == GPU_UNIDENTIFIED
