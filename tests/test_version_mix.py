"""A deploy during the recording: the fastest and the slowest process ran different
``service.version``s (:mod:`otel_stages.analysis.process_mix`). A tester's: pod-a (1.4.0) served
40 requests with a steady 120 ms forward, then pod-b (1.5.0) 40 with a steady 240 ms forward, the
GPU busy in every forward: both reports said a confident ``gpu_busy`` with "add GPU capacity",
because processes that ran one after the other (a recycled worker under a rising load) are no
slower replica. Differing versions make the verdict tentative whether or not the processes
overlapped; one version (or none) keeps the old rule. The rule, its threshold pinned on both
sides, the figures from the requests, the text report, and the file report and the ClickHouse
report agreeing with real chDB."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from otel_stages.analysis import load_paths
from otel_stages.analysis.decision import decide
from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.process_mix import (
    PROCESS_MIX_DOMINATES,
    ProcessMean,
    ProcessMix,
    one_version,
    process_mix,
)
from otel_stages.analysis.requests import find_requests
from otel_stages.render import render_text
from tests import odd_inputs
from tests.test_clickhouse_issues import _span_gpu, engine, reports
from tests.test_decision import figures, stage

__all__ = ["engine"]  # the chDB fixture, used by name

_A = "service.name=vlm,service.instance.id=pod-a"
_B = "service.name=vlm,service.instance.id=pod-b"
_VERSION_LINE = "the request total changed with the version (service.version)"


def _mix(explains: float, fast_version: str, slow_version: str, *, together: bool,
         version_explains: float | None = -1.0) -> ProcessMix:
    """pod-a (fast, 146.9 ms) from 0 to 100, pod-b (slow, 267.9 ms) from 100 (one after the other)
    or from 50 (overlapping) to 200; two processes: the versions explain what the processes do
    (``version_explains`` -1: ``explains``)."""
    return ProcessMix(explains=explains, processes=2,
                      version_explains=explains if version_explains == -1.0 else version_explains,
                      fastest=ProcessMean(_A, 39, 146.9, 0, 100, version=fast_version),
                      slowest=ProcessMean(_B, 39, 267.9, 50 if together else 100, 200,
                                          version=slow_version))


def _fig() -> Any:
    fig = figures(stage("forward", 120.0, explains=0.99), total_swing=120.0)
    assert decide(fig).tentative is False
    return fig


def test_a_deploy_during_the_recording_makes_the_verdict_tentative() -> None:
    v = decide(replace(_fig(), process_mix=_mix(0.998, "1.4.0", "1.5.0", together=False)))
    assert v.tentative is True and v.cause == "forward"
    first = v.evidence[0]
    assert first.startswith(_VERSION_LINE)
    assert "146.9 ms on 1.4.0 (" + _A + ", 39 warm requests)" in first
    assert "267.9 ms on 1.5.0 (" + _B + ", 39, +82%)" in first
    assert "one after the other (a deploy during the recording)" in first
    assert v.advice[0].startswith(f"compare service.version 1.5.0 ({_B}) with 1.4.0 ({_A})")
    assert "--baseline 1.4.0.jsonl" in v.advice[0]


def test_the_earlier_version_comes_first_when_the_new_one_is_faster() -> None:
    # a deploy that made it faster: the slow process ran first
    mix = _mix(0.998, "1.5.0", "1.4.0", together=False)
    mix = replace(mix, fastest=replace(mix.fastest, first_ns=100, last_ns=200),
                  slowest=replace(mix.slowest, first_ns=0, last_ns=100))
    line = decide(replace(_fig(), process_mix=mix)).evidence[0]
    assert line.index("on 1.4.0") < line.index("on 1.5.0") and "-45%" in line


def test_versions_side_by_side_say_so() -> None:
    # a canary: overlapping processes were tentative before; now the version leads
    v = decide(replace(_fig(), process_mix=_mix(0.998, "1.4.0", "1.5.0", together=True)))
    assert v.tentative is True
    assert v.evidence[0].startswith(_VERSION_LINE)
    assert "side by side (a canary or a partial rollout)" in v.evidence[0]


@pytest.mark.parametrize("fast_version, slow_version", [
    ("1.4.0", "1.4.0"), ("", ""), ("", "1.5.0"), ("1.4.0", "")])
def test_one_version_or_none_one_after_the_other_is_no_slower_replica(
        fast_version: str, slow_version: str) -> None:
    # the recycled worker's protection: same version (or an unknown one), one after the other
    mix = _mix(0.998, fast_version, slow_version, together=False)
    assert not mix.versions_differ and not mix.dominates
    v = decide(replace(_fig(), process_mix=mix))
    assert v.tentative is False
    assert not any(e.startswith((_VERSION_LINE, "the process explains")) for e in v.evidence)


def test_one_version_side_by_side_keeps_the_replica_line() -> None:
    v = decide(replace(_fig(), process_mix=_mix(0.998, "1.4.0", "1.4.0", together=True)))
    assert v.tentative is True and v.evidence[0].startswith("the process explains 100%")
    assert v.advice[0].startswith(f"compare {_B} with {_A} (hw.model")


@pytest.mark.parametrize("explains, said", [
    (PROCESS_MIX_DOMINATES - 0.001, False), (PROCESS_MIX_DOMINATES, True), (0.51, True)])
def test_the_version_rule_keeps_the_process_mix_threshold(explains: float, said: bool) -> None:
    assert PROCESS_MIX_DOMINATES == 0.5
    v = decide(replace(_fig(), process_mix=_mix(explains, "1.4.0", "1.5.0", together=False)))
    assert v.tentative is said
    assert v.evidence[0].startswith(_VERSION_LINE) is said


def test_one_version_of_a_process() -> None:
    assert one_version({"1.4.0"}) == "1.4.0"
    assert one_version(["1.4.0", "1.4.0"]) == "1.4.0"
    assert one_version({""}) == "" and one_version(set()) == ""
    assert one_version({"1.4.0", "1.5.0"}) == ""  # a restart under one instance id: not one
    assert one_version({"1.4.0", ""}) == ""


# --- from spans ----------------------------------------------------------------------------------


def _pods(tmp_path: Path, pods: Sequence[tuple[str, float, str | None, str]], *, together: bool,
          name: str) -> Path:
    """Each of ``pods`` (instance id, forward ms +- 2, ``service.version`` or ``None``, host.name)
    serves 30 requests, one pod after the other (60 s apart) or, ``together``, at the same time;
    the GPU busy (0.94) in every forward. Written to ``name``.jsonl in ``tmp_path``."""
    lines: list[str] = []
    start_s = 0
    for n, (pod, forward_ms, version, host) in enumerate(pods):
        def stages(i: int, r: Any, forward_ms: float = forward_ms) -> list[tuple[str, float]]:
            return [("download", 10.0 + r.random()), ("decode", 12.0 + r.random()),
                    ("resize", 4.0 + r.random()), ("queue", 1.0 + r.random()),
                    ("forward", forward_ms + 4 * r.random() - 2)]
        rows = odd_inputs.run(30, stages, seed=n + 1)
        _span_gpu(rows, lambda i, slow: 0.94)
        for spans in rows:
            for sp in spans:
                for k in ("startTimeUnixNano", "endTimeUnixNano"):
                    sp[k] = str(int(sp[k]) + start_s * 10**9)
        if not together:
            start_s += 60  # 30 requests of under 300 ms, 100 ms apart: done within 15 s
        path = odd_inputs.write(tmp_path / f"{pod}.jsonl", rows)
        resource = [odd_inputs._attr("service.name", "vlm"), odd_inputs._attr("service.instance.id", pod),
                    odd_inputs._attr("host.name", host)]
        if version is not None:
            resource.append(odd_inputs._attr("service.version", version))
        for line in path.read_text().splitlines():
            doc = json.loads(line)
            doc["resourceSpans"][0]["resource"]["attributes"] = resource
            lines.append(json.dumps(doc))
    merged = tmp_path / f"{name}.jsonl"
    merged.write_text("\n".join(lines) + "\n")
    return merged


def _deploy(tmp_path: Path, versions: tuple[str | None, str | None], *, slow_ms: float = 240.0,
            together: bool = False) -> Path:
    """pod-a (forward 120 ms, ``versions[0]``) serves 30 requests, then (or, ``together``, at the
    same time) pod-b (forward ``slow_ms``, ``versions[1]``) 30, on one host; ``None``: no
    ``service.version``."""
    return _pods(tmp_path, [("pod-a", 120.0, versions[0], "node-1"), ("pod-b", slow_ms, versions[1], "node-1")],
                 together=together, name="deploy")


def test_the_versions_come_from_each_process_resource(tmp_path: Path) -> None:
    warm = [r for r in find_requests(load_paths([_deploy(tmp_path, ("1.4.0", "1.5.0"))]).spans)
            if not r.cold]
    mix = process_mix(warm)
    assert mix is not None and mix.explains > 0.99 and not mix.together
    assert (mix.fastest.key, mix.fastest.version) == (_A, "1.4.0")
    assert (mix.slowest.key, mix.slowest.version) == (_B, "1.5.0")
    assert mix.to_dict()["slowest"]["service_version"] == "1.5.0"  # type: ignore[index]


def test_versions_are_read_only_for_a_mix_that_dominates(tmp_path: Path) -> None:
    # pod-b 1 ms slower than pod-a, within the noise: no caveat, no version read (as in the SQL)
    warm = [r for r in find_requests(load_paths([_deploy(tmp_path, ("1.4.0", "1.5.0"),
                                                         slow_ms=121.0)]).spans) if not r.cold]
    mix = process_mix(warm)
    assert mix is not None and mix.explains < PROCESS_MIX_DOMINATES
    assert mix.fastest.version == mix.slowest.version == ""
    assert mix.to_dict()["fastest"]["service_version"] is None  # type: ignore[index]


def test_the_text_report_shows_the_version_line(tmp_path: Path) -> None:
    text = render_text(diagnose(load_paths([_deploy(tmp_path, ("1.4.0", "1.5.0"))])), width=200)
    assert "tentative" in text.split("Evidence:")[0]
    evidence = text.split("Evidence:")[1]
    assert evidence.lstrip().startswith("- " + _VERSION_LINE)
    assert "compare service.version 1.5.0" in text.split("Advice:")[1].split("\n")[1]


# --- both reports --------------------------------------------------------------------------------


@pytest.mark.parametrize("versions, together, tentative, line", [
    (("1.4.0", "1.5.0"), False, True, _VERSION_LINE),  # the deploy
    (("1.4.0", "1.5.0"), True, True, _VERSION_LINE),  # a canary
    (("1.4.0", "1.4.0"), False, False, None),  # one version one after the other: as before
    ((None, None), False, False, None),  # no version: as before
    (("1.4.0", "1.4.0"), True, True, "the process explains"),  # a slower replica
])
def test_both_reports_read_the_versions_alike(engine, tmp_path: Path, versions: tuple[str | None, ...],
                                              together: bool, tentative: bool, line: str | None) -> None:
    got, want = reports(engine, _deploy(tmp_path, versions, together=together))  # type: ignore[arg-type]
    assert want["verdict"]["cause"] == "gpu_busy"
    assert want["verdict"]["tentative"] is tentative
    assert want["process_mix"]["explains"] > 0.99
    if line is None:
        assert not any(e.startswith((_VERSION_LINE, "the process explains"))
                       for e in want["verdict"]["evidence"])
    else:
        assert want["verdict"]["evidence"][0].startswith(line)
    assert want["process_mix"]["slowest"]["service_version"] == versions[1]
    assert got["verdict"] == want["verdict"]
    assert {k: v for k, v in got["process_mix"].items() if k != "explains"} == {
        k: v for k, v in want["process_mix"].items() if k != "explains"}


def test_neither_report_reads_the_versions_below_the_threshold(engine, tmp_path: Path) -> None:
    # pod-b 1 ms slower, within the noise: the process mix does not dominate, the versions are
    # not read (the SQL runs no version statement, the 10 M-span benchmark pays nothing)
    got, want = reports(engine, _deploy(tmp_path, ("1.4.0", "1.5.0"), slow_ms=121.0))
    assert want["process_mix"]["explains"] < PROCESS_MIX_DOMINATES
    assert want["process_mix"]["slowest"]["service_version"] is None
    assert not any(e.startswith(_VERSION_LINE) for e in want["verdict"]["evidence"])
    assert got["verdict"] == want["verdict"]
    assert {k: v for k, v in got["process_mix"].items() if k != "explains"} == {
        k: v for k, v in want["process_mix"].items() if k != "explains"}


@pytest.mark.parametrize(("version_explains", "said"), [(0.8 * 0.998, True), (0.8 * 0.998 - 0.001, False),
                                                       (None, False)])
def test_the_versions_must_explain_the_processes(version_explains: float | None, said: bool) -> None:
    # a third tester's: v1.0 on a fast node, v1.0 and the v1.1 canary on slow nodes read as "the
    # request total changed with the version": the versions explained 29 % of what the processes did
    from otel_stages.analysis.process_mix import VERSION_MIX_MIN_SHARE

    assert VERSION_MIX_MIN_SHARE == 0.8
    mix = _mix(0.998, "1.0", "1.1", together=True, version_explains=version_explains)
    v = decide(replace(_fig(), process_mix=mix))
    assert v.tentative  # side by side: a slower replica either way
    assert v.evidence[0].startswith(_VERSION_LINE) is said
    assert v.evidence[0].startswith("the process explains") is not said


def _nodes(tmp_path: Path) -> Path:
    """Three pods side by side: pod-a v1.0 on a fast node (forward 120 ms), pod-b v1.0 and pod-c
    v1.1 on slow nodes (forward 210 and 215 ms); the GPU busy in every forward."""
    return _pods(tmp_path, [("pod-a", 120.0, "1.0", "node-0"), ("pod-b", 210.0, "1.0", "node-1"),
                            ("pod-c", 215.0, "1.1", "node-2")], together=True, name="nodes")


def test_a_version_that_does_not_explain_the_processes_is_not_blamed_in_both_reports(
        engine, tmp_path: Path) -> None:
    got, want = reports(engine, _nodes(tmp_path))
    assert want["process_mix"]["explains"] > 0.9
    assert want["verdict"]["tentative"]
    assert want["verdict"]["evidence"][0].startswith("the process explains"), want["verdict"]["evidence"]
    assert not any(e.startswith(_VERSION_LINE) for e in want["verdict"]["evidence"])
    assert got["verdict"] == want["verdict"]
