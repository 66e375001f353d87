"""The attributes ``otel-stages report`` keeps from files (otel_stages.analysis.selection) cover
every attribute the analysis reads: a module that starts reading a new key without adding it to
ANALYSIS_ATTRIBUTES would silently see nothing in the CLI while its unit tests (which build spans
directly, or load with every attribute kept) pass. Three nets: the analysis, the text report and
the HTML report's data run over every recorded case with attribute dicts that note each key read;
the CLI's report equals the library's full-load report on every case; and a source check for reads
no case reaches. Also: a --stage-map's attributes are kept, and the records stay frozen values."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import msgspec
import pytest

import otel_stages.analysis
from otel_stages import semconv
from otel_stages.analysis import Recording, Span, diagnose, load_paths
from otel_stages.analysis.charts import report_charts
from otel_stages.analysis.selection import ALL, ANALYSIS_ATTRIBUTES, Selection, for_analysis
from otel_stages.analysis.stage_map import load_stage_map
from otel_stages.cli import main
from otel_stages.render import render

ANALYSIS = Path(otel_stages.analysis.__file__).parent
TRACES = Path(__file__).parent / "data" / "traces"
#: every recorded case: the diagnosis cases, the issue-13 signal faults, the trust cases
CASES = sorted(TRACES.glob("*.jsonl")) + sorted((TRACES / "trust").glob("*.jsonl"))
PAIRS = sorted(p for p in CASES if p.name.endswith(".before.otlp.jsonl"))

# --- 1. what the analysis, the text report and the HTML data read, run on every case ----------


class _Noting(dict):  # type: ignore[type-arg]
    """An attribute dict that notes every key looked up in it."""

    read: ClassVar[set[str]] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        _Noting.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: Any) -> Any:
        _Noting.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key: object) -> bool:
        _Noting.read.add(str(key))
        return super().__contains__(key)


def _noting(recording: Recording) -> Recording:
    """``recording`` with every span and span-event attribute dict noting its reads."""
    spans = []
    for span in recording.spans:
        events = tuple(msgspec.structs.replace(e, attributes=_Noting(e.attributes))
                       for e in span.events)
        spans.append(msgspec.structs.replace(span, attributes=_Noting(span.attributes),
                                             events=events))
    return Recording(spans=spans, metrics=recording.metrics, problems=recording.problems)


def _everything(recording: Recording, baseline: Recording | None = None) -> None:
    """Everything ``otel-stages report`` (text, --json, --html) derives from the recording."""
    report = diagnose(recording, baseline=baseline)
    render(report, file=io.StringIO(), width=120)
    json.dumps(report.to_dict())
    report_charts(recording, baseline=baseline, report=report)


@pytest.fixture
def noted() -> Iterator[set[str]]:
    _Noting.read = set()
    yield _Noting.read


def test_every_attribute_the_analysis_reads_on_the_cases_is_kept(noted: set[str]):
    for path in CASES:
        _everything(_noting(load_paths([path])))
    for before in PAIRS:
        after = before.with_name(before.name.replace(".before.", ".after."))
        _everything(_noting(load_paths([after])), _noting(load_paths([before])))
    # the net is alive: the cases reach the reads of issue 7, 12 and 13's modules. (Not noted:
    # the image.* keys requests.py reads from a merged copy of the dicts, and the GC events'
    # duration, read only when a span lacks its pause total: sections 2 and 3 cover those.)
    assert {semconv.QUEUE_DEPTH, semconv.REQUEST_COLD_START, semconv.STAGE_NAME,
            semconv.THREAD_CPU_TIME_MS, semconv.GC_PAUSE_MS, semconv.EVENT_LOOP_LAG_MS,
            semconv.EVENT_LOOP_HELD_MS, semconv.THREAD_NAME, semconv.IMAGE_TARGET_WIDTH} <= noted
    missing = sorted(noted - ANALYSIS_ATTRIBUTES)
    assert not missing, f"the analysis reads these; add them to selection.ANALYSIS_ATTRIBUTES: {missing}"


def test_the_noting_net_catches_a_read_of_a_dropped_key(noted: set[str]):
    recording = _noting(load_paths([TRACES / "stable.otlp.jsonl"]))
    recording.spans[0].attributes.get(semconv.IMAGE_MODE)  # what a new module might do
    assert semconv.IMAGE_MODE in noted - ANALYSIS_ATTRIBUTES


# --- 2. the CLI's report (selective load) is the full load's, case by case --------------------


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_the_report_reads_the_same_from_a_selective_load(path: Path, capsys):
    full = diagnose(load_paths([path])).to_dict()
    assert diagnose(load_paths([path], selection=for_analysis())).to_dict() == full
    assert main(["report", str(path), "--json"]) in (0, 1)
    assert json.loads(capsys.readouterr().out) == full


def test_a_dropped_attribute_changes_some_report():
    """The comparison above can fail: without the GC and CPU-time keys, the gc_pause case loses
    its mechanism evidence."""
    path = TRACES / "gc_pause.otlp.jsonl"
    less = Selection(ANALYSIS_ATTRIBUTES - {semconv.GC_PAUSE_MS, semconv.GC_DURATION_MS,
                                            semconv.THREAD_CPU_TIME_MS})
    full = diagnose(load_paths([path])).to_dict()
    assert diagnose(load_paths([path], selection=less)).to_dict() != full


# --- 3. the sources, for reads no case reaches ------------------------------------------------

# attributes.get(semconv.X ...), attrs[semconv.X], stage_attribute(stage, semconv.X),
# _first_int(spans, semconv.X), attribute_evidence(warm, stage, semconv.X)
READS = re.compile(r"(?:(?:attributes|attrs)(?:\.get)?[\[(]\s*|"
                   r"stage_attribute\([^,()]*,\s*|_first_(?:int|str)\([^,()]*,\s*|"
                   r"attribute_evidence\([^,()]*,[^,()]*,\s*)semconv\.([A-Z0-9_]+)")


def _keys_read() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(ANALYSIS.glob("*.py")):
        for name in READS.findall(path.read_text(encoding="utf-8")):
            found.setdefault(getattr(semconv, name), set()).add(path.name)
    return found


def test_every_attribute_the_analysis_names_in_a_read_is_kept():
    read = _keys_read()
    assert {semconv.QUEUE_DEPTH, semconv.GPU_UTILIZATION_MEAN, semconv.REQUEST_COLD_START,
            semconv.BATCH_SIZE, semconv.STAGE_NAME, semconv.THREAD_CPU_TIME_MS,
            semconv.GC_DURATION_MS, semconv.IMAGE_DRAFT_SCALE} <= set(read)
    missing = {key: sorted(files) for key, files in read.items() if key not in ANALYSIS_ATTRIBUTES}
    assert not missing, f"add these to selection.ANALYSIS_ATTRIBUTES: {missing}"


@pytest.mark.parametrize("line", [
    "    cpu = span.attributes.get(semconv.IMAGE_MODE)\n",
    "    cpu = _number(attrs.get(semconv.IMAGE_MODE))\n",
    "    r.stage_attribute(semconv.STAGE_DECODE, semconv.IMAGE_MODE)\n",
])
def test_the_source_check_notices_a_new_read(line: str):
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
    # events and spans, and the label naming each stage's model
    assert load_stage_map("triton").attribute_keys() == frozenset({"triton.model_name"})


def test_records_are_frozen_values():
    span = Span("t", "s", None, "decode", 1, 2)
    with pytest.raises(AttributeError):
        span.name = "resize"  # type: ignore[misc]
    renamed = msgspec.structs.replace(span, name="resize")
    assert renamed.name == "resize" and span.name == "decode"
    assert renamed == Span("t", "s", None, "resize", 1, 2) and renamed != span
    assert Span("t", "s", None, "a", 1, 2).attributes is not Span("t", "s", None, "a", 1, 2).attributes
    assert span.duration_ms == 1e-6
