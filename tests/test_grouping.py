"""Grouping spans into requests trace by trace (otel_stages.analysis.requests): which span an input
attribute comes from, duplicates, malformed trees, and spans whose ids repeat across traces."""

from __future__ import annotations

import pytest

from otel_stages import semconv
from otel_stages.analysis import Span
from otel_stages.analysis.requests import find_requests, group_spans, process_key, process_keys

T0 = 1_790_000_000_000_000_000
MS = 1_000_000
RESOURCE = {semconv.SERVICE_NAME: "svc", semconv.SERVICE_INSTANCE_ID: "p1"}


def _request(trace: str = "t1", *, decode: dict | None = None, resize: dict | None = None,
             request: dict | None = None) -> list[Span]:
    return [
        Span(trace, "d", "r", "download", T0, T0 + 2 * MS, {semconv.IMAGE_SIZE: 999}, RESOURCE),
        Span(trace, "c", "r", "decode", T0 + 2 * MS, T0 + 5 * MS, decode or {}, RESOURCE),
        Span(trace, "z", "r", "resize", T0 + 5 * MS, T0 + 6 * MS, resize or {}, RESOURCE),
        Span(trace, "r", None, "request", T0, T0 + 10 * MS, request or {}, RESOURCE),
    ]


@pytest.mark.parametrize("decode, resize, on_request, expected", [
    # decode's own attributes first (its contract), even when an earlier stage has the key
    ({semconv.IMAGE_WIDTH: 640, semconv.IMAGE_HEIGHT: 480}, {semconv.IMAGE_WIDTH: 224}, {},
     (640, 480, 999, None, None)),
    # a float width counts (as an int); a bool never does, nor an empty format
    ({semconv.IMAGE_WIDTH: 640.0, semconv.IMAGE_FORMAT: ""}, {semconv.IMAGE_FORMAT: "PNG"}, {},
     (640, None, 999, "PNG", None)),
    ({semconv.IMAGE_WIDTH: True}, {semconv.IMAGE_WIDTH: 320}, {}, (320, None, 999, None, None)),
    # an explicit None on decode leaves the key to later spans, the request span last
    ({semconv.IMAGE_HEIGHT: None}, {}, {semconv.IMAGE_HEIGHT: 100, semconv.PROMPT_TOKENS: 12},
     (None, 100, 999, None, 12)),
    ({semconv.IMAGE_SIZE: 1234}, {}, {}, (None, None, 1234, None, None)),
])
def test_input_attributes_come_from_the_first_span_that_has_a_usable_value(decode, resize,
                                                                           on_request, expected):
    (req,) = find_requests(_request(decode=decode, resize=resize, request=on_request))
    assert (req.image_width, req.image_height, req.image_bytes, req.image_format,
            req.prompt_tokens) == expected


def test_the_same_span_ids_in_different_traces_are_different_requests():
    spans = _request("t1") + _request("t2") + _request("t1")  # t1 read twice: counted once
    grouping = group_spans(spans)
    assert [r.trace_id for r in grouping.requests] == ["t1", "t2"]
    assert all(set(r.stages_ms) == {"download", "decode", "resize"} for r in grouping.requests)
    assert grouping.incomplete == []


def test_a_span_that_is_its_own_parent_does_not_break_grouping():
    spans = [*_request(), Span("t1", "loop", "loop", "forward", T0 + 6 * MS, T0 + 9 * MS)]
    grouping = group_spans(spans)
    assert len(grouping.requests) == 1
    assert "forward" not in grouping.requests[0].stages_ms


def test_stage_spans_of_one_request_in_any_order_across_a_shuffled_recording():
    import random

    spans = [s for i in range(50) for s in _request(f"t{i:03d}")]
    reference = [(r.trace_id, r.stages_ms) for r in find_requests(spans)]
    random.Random(7).shuffle(spans)
    assert [(r.trace_id, r.stages_ms) for r in find_requests(spans)] == reference


def test_process_keys_are_worked_out_once_per_resource():
    requests = find_requests(_request("t1") + _request("t2"))
    other = {semconv.SERVICE_NAME: "svc"}
    alone = find_requests([Span("t3", "c", "r", "decode", T0, T0 + MS, {}, other),
                           Span("t3", "r", None, "request", T0, T0 + 2 * MS, {}, other)])
    assert process_keys([*requests, *alone]) == ["service.name=svc,service.instance.id=p1"] * 2 + ["service.name=svc"]


@pytest.mark.parametrize("resource, key", [
    ({"service.instance.id": "i1", "service.name": "svc", "host.name": "node-a"},
     "service.name=svc,service.instance.id=i1"),
    # two services sharing an instance id (a pod name used by both its containers) are two processes
    ({"service.instance.id": "pod-7", "service.name": "svc-y"}, "service.name=svc-y,service.instance.id=pod-7"),
    ({"service.namespace": "shop", "service.instance.id": "pod-7", "service.name": "svc-x", "host.name": "n"},
     "service.namespace=shop,service.name=svc-x,service.instance.id=pod-7"),
    ({"service.namespace": "shop", "service.name": "svc", "host.name": "node-a"},
     "service.namespace=shop,service.name=svc,host.name=node-a"),
    ({"service.instance.id": "i1"}, "service.instance.id=i1"),
    ({"service.name": "svc", "host.name": "node-a"}, "service.name=svc,host.name=node-a"),
    ({"service.name": "svc", "host.name": ""}, "service.name=svc"),
    ({"service.instance.id": "", "host.name": "node-a"}, "host.name=node-a"),
    ({}, ""),
])
def test_a_process_is_its_service_and_instance_else_its_service_on_its_host(resource: dict, key: str) -> None:
    # two hosts running one service without instance ids (one process per host) are two processes
    assert process_key(resource) == key


def test_a_boolean_resource_value_is_named_as_the_collector_stores_it() -> None:
    # the ClickHouse exporter stores attribute values as pcommon.Value.AsString: a boolean
    # instance id is "true" there, and the file report named it "True": two names for one process
    assert process_key({"service.name": "svc", "service.instance.id": True}) == (
        "service.name=svc,service.instance.id=true")
