"""The attributes ``otel-stages report`` keeps from files (otel_stages.analysis.selection) cover
every attribute the analysis reads: a module that starts reading a new key without adding it to
ANALYSIS_ATTRIBUTES would silently see nothing in the CLI while its unit tests (which build spans
directly) pass. Also: a --stage-map's attributes are kept, and the records stay frozen values."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

import otel_stages.analysis
from otel_stages import semconv
from otel_stages.analysis import Span
from otel_stages.analysis.selection import ALL, ANALYSIS_ATTRIBUTES, Selection, for_analysis
from otel_stages.analysis.stage_map import load_stage_map

ANALYSIS = Path(otel_stages.analysis.__file__).parent
# attributes.get(semconv.X ...), attributes[semconv.X], stage_attribute(stage, semconv.X),
# _first_int(spans, semconv.X), attribute_evidence(warm, stage, semconv.X)
READS = re.compile(r"(?:attributes(?:\.get)?[\[(]|stage_attribute\(|_first_(?:int|str)\(|"
                   r"attribute_evidence\()[^)\]\n]*?semconv\.([A-Z0-9_]+)")


def _keys_read() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(ANALYSIS.glob("*.py")):
        for name in READS.findall(path.read_text(encoding="utf-8")):
            found.setdefault(getattr(semconv, name), set()).add(path.name)
    return found


def test_every_attribute_the_analysis_reads_is_kept():
    read = _keys_read()
    assert {semconv.IMAGE_WIDTH, semconv.QUEUE_DEPTH, semconv.GPU_UTILIZATION_MEAN,
            semconv.REQUEST_COLD_START, semconv.BATCH_SIZE, semconv.STAGE_NAME} <= set(read)
    missing = {key: sorted(files) for key, files in read.items() if key not in ANALYSIS_ATTRIBUTES}
    assert not missing, f"add these to selection.ANALYSIS_ATTRIBUTES: {missing}"


def test_the_source_check_notices_a_new_read(tmp_path):
    line = "    cpu = span.attributes.get(semconv.IMAGE_MODE)\n"
    assert READS.findall(line) == ["IMAGE_MODE"] and semconv.IMAGE_MODE not in ANALYSIS_ATTRIBUTES


def test_selections():
    assert ALL.keeps("anything") and ALL.including(["x"]) is ALL
    kept = for_analysis(["gen_ai.latency.time_in_queue"])
    assert kept.keeps(semconv.IMAGE_WIDTH) and kept.keeps("gen_ai.latency.time_in_queue")
    assert not kept.keeps(semconv.URL_FULL)
    assert Selection(frozenset({"a"})).including(["b"]).attributes == {"a", "b"}


def test_a_stage_map_names_the_attributes_it_reads():
    vllm = load_stage_map("vllm")
    assert vllm.attribute_keys() and all(k.startswith("gen_ai.") for k in vllm.attribute_keys())
    assert load_stage_map("triton").attribute_keys() == frozenset()  # events and spans only


def test_records_are_frozen_values():
    span = Span("t", "s", None, "decode", 1, 2)
    with pytest.raises(AttributeError):
        span.name = "resize"  # type: ignore[misc]
    renamed = msgspec.structs.replace(span, name="resize")
    assert renamed.name == "resize" and span.name == "decode"
    assert renamed == Span("t", "s", None, "resize", 1, 2) and renamed != span
    assert Span("t", "s", None, "a", 1, 2).attributes is not Span("t", "s", None, "a", 1, 2).attributes
    assert span.duration_ms == 1e-6
