"""Attribute normalisation and caps: numpy values, sequences, bytes, prompts, long strings, and the
status / exception messages of failed stages."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from opentelemetry.trace import StatusCode

import otel_stages as ots
from otel_stages import attributes, semconv
from otel_stages.attributes import cap, clean_attributes, clean_value


@pytest.fixture
def limit():
    saved = attributes.value_length_limit()
    yield attributes.set_value_length_limit
    attributes.set_value_length_limit(saved)


def test_numpy_values_become_python_scalars_and_lists_without_warnings(captured, caplog):
    values = {"image.width": np.int64(224), "score": np.float32(0.5), "flag": np.bool_(True),
              "shape": np.array([3, 224, 224]), "zero_d": np.array(7), "name": np.str_("vit"),
              "pair": (1, 2.5), "labels": ("cat", 2), "gap": None}
    with caplog.at_level(logging.WARNING):
        with ots.stage("forward", **values):
            pass
    attrs = dict(captured.one("forward").attributes)
    assert attrs == {"image.width": 224, "score": 0.5, "flag": True, "shape": (3, 224, 224),
                     "zero_d": 7, "name": "vit", "pair": (1.0, 2.5), "labels": ("cat", "2")}
    assert [type(attrs[k]) for k in ("image.width", "score", "flag", "zero_d", "name")] == \
        [int, float, bool, int, str]
    assert all(type(v) is float for v in attrs["pair"])
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_queue_span_attributes_are_cleaned_too(captured, caplog):
    with caplog.at_level(logging.WARNING):
        with ots.request():
            token = ots.enqueue_token(depth=np.int64(3))
        with ots.dequeue(token, **{"batch.slot": np.int32(1), "note": np.str_("fifo")}):
            pass
    attrs = dict(captured.one(semconv.STAGE_QUEUE).attributes)
    assert attrs == {"batch.slot": 1, "note": "fifo", semconv.QUEUE_DEPTH: 3}
    assert [type(attrs[k]) for k in attrs] == [int, str, int]
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_plain_attributes_are_passed_through_without_a_copy():
    plain = {"a": 1, "b": 2.0, "c": True, "d": "short"}
    assert clean_attributes(plain) is plain
    assert clean_attributes({}) == {}


def test_long_strings_are_capped_with_a_visible_marker_and_the_original_length(captured, limit):
    prompt_like = "x" * 1_000_000
    with ots.stage("forward", note=prompt_like):
        pass
    value = captured.one("forward").attributes["note"]
    assert len(value) == 4096
    assert value.endswith("…[truncated, 1000000 chars]") and value.startswith("xxxx")
    limit(100)
    assert cap("y" * 500) == "y" * (100 - len("…[truncated, 500 chars]")) + "…[truncated, 500 chars]"
    assert len(cap("y" * 500)) == 100
    assert cap("y" * 100) == "y" * 100  # exactly at the limit: untouched
    assert cap("y" * 101).endswith("[truncated, 101 chars]")
    assert cap("z" * 50, 10) == "z" * 10  # too short for the marker: a plain cut


def test_prompts_and_bytes_are_recorded_only_as_length_and_hash(captured):
    image_bytes = bytes(range(256)) * 10
    with ots.stage("forward", prompt="Describe this photo.", **{"gen_ai.prompt": "secret plan",
                                                                 "user_prompt": "hi there",
                                                                 "pixels": image_bytes}):
        pass
    attrs = captured.one("forward").attributes
    assert attrs["prompt"].startswith("[not recorded: 20 chars, sha256 ")
    assert attrs["gen_ai.prompt"].startswith("[not recorded: 11 chars, sha256 ")
    assert attrs["user_prompt"].startswith("[not recorded: 8 chars")
    assert attrs["pixels"].startswith("[not recorded: 2560 bytes, sha256 ")
    assert "Describe" not in str(dict(attrs)) and "secret plan" not in str(dict(attrs))
    # the same prompt gives the same hash (so repeated inputs can still be grouped)
    assert clean_value("same", key="prompt") == clean_value("same", key="prompt")
    assert clean_value("same", key="prompt") != clean_value("other", key="prompt")


def test_large_and_multidimensional_arrays_are_described_not_dumped():
    assert clean_value(np.zeros((3, 224, 224), dtype=np.float32)) == \
        "[ndarray float32 shape (3, 224, 224): 150528 items, not recorded]"
    assert clean_value(list(range(1000))) == "[list of 1000 items, not recorded]"
    assert clean_value(list(range(attributes.MAX_SEQUENCE_ITEMS))) == list(range(attributes.MAX_SEQUENCE_ITEMS))
    assert clean_value([True, False]) == [True, False]
    assert clean_value([1, None, 2.5]) == [1.0, None, 2.5]


def test_a_huge_exception_message_is_capped_in_status_event_and_stacktrace(captured):
    with pytest.raises(ValueError) as info:
        with ots.stage("decode"):
            raise ValueError("bad pixel " + "p" * 2_000_000)
    assert len(str(info.value)) > 2_000_000  # the caller's exception is untouched
    span = captured.one("decode")
    assert span.status.status_code is StatusCode.ERROR
    assert len(span.status.description) == 4096
    assert span.status.description.startswith("ValueError: bad pixel ppp")
    assert span.status.description.endswith("…[truncated, 2000022 chars]")
    (event,) = span.events
    message = event.attributes[semconv.EXCEPTION_MESSAGE]
    stack = event.attributes[semconv.EXCEPTION_STACKTRACE]
    assert len(message) == 4096 and message.endswith("…[truncated, 2000010 chars]")
    assert len(stack) <= 4096 and stack.startswith("Traceback (most recent call last)")
    assert "raise ValueError" in stack and "[truncated, 2000023 chars]" in stack  # message line capped
    assert event.attributes["exception.type"] == "ValueError"
    assert span.attributes[semconv.ERROR_TYPE] == "ValueError"


def test_a_deep_traceback_keeps_its_innermost_frames(captured):
    def dive(depth: int) -> None:  # two alternating frames: Python does not fold them
        if depth == 0:
            raise RuntimeError("bottom")
        other(depth - 1)

    def other(depth: int) -> None:
        dive(depth)

    with pytest.raises(RuntimeError):
        with ots.stage("forward"):
            dive(150)
    (event,) = captured.one("forward").events
    stack = event.attributes[semconv.EXCEPTION_STACKTRACE]
    assert len(stack) == 4096 and stack.startswith("[truncated, ")
    assert stack.endswith("RuntimeError: bottom\n") and 'raise RuntimeError("bottom")' in stack


def test_short_exception_keeps_the_full_standard_event(captured):
    with pytest.raises(KeyError):
        with ots.stage("decode"):
            raise KeyError("missing")
    (event,) = captured.one("decode").events
    assert event.attributes[semconv.EXCEPTION_MESSAGE] == "'missing'"
    assert event.attributes[semconv.EXCEPTION_STACKTRACE].startswith("Traceback (most recent call last)")
    assert "KeyError: 'missing'" in event.attributes[semconv.EXCEPTION_STACKTRACE]


def test_limit_follows_the_otel_env_var_and_the_setting(monkeypatch):
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "300")
    assert attributes._limit_from_env() == 300
    monkeypatch.setenv("OTEL_STAGES_ATTRIBUTE_VALUE_LENGTH_LIMIT", "50")
    assert attributes._limit_from_env() == 50
    monkeypatch.delenv("OTEL_STAGES_ATTRIBUTE_VALUE_LENGTH_LIMIT")
    monkeypatch.delenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT")
    assert attributes._limit_from_env() == attributes.DEFAULT_VALUE_LENGTH_LIMIT


def test_an_object_with_a_broken_str_is_left_out_not_raised(captured):
    class Broken:
        def __str__(self):
            raise RuntimeError("no")

    with ots.stage("forward", thing=Broken(), ok=1):
        pass
    assert dict(captured.one("forward").attributes) == {"ok": 1}
