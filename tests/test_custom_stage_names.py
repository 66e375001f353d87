"""Common custom stage names (a tester's hand-instrumented service: ``fetch_image``,
``preprocess`` carrying ``image.width`` / ``image.height``, ``inference`` the model call): a
``preprocess`` stage whose time follows the image sizes was advised to record the sizes it already
had; an ``inference`` stage swinging with GPU readings around it got only "time its sub-steps".
Now a ``preprocess`` stage gets the size evidence decode and resize get, in both reports' rules,
and a custom stage's advice says how naming or mapping it as a standard stage reads that stage's
evidence."""

from __future__ import annotations

from otel_stages import semconv
from otel_stages.analysis import Recording, Span, diagnose
from otel_stages.analysis import advice as advice_text

T0 = 1_700_000_000 * 10**9
MS = 1_000_000


def _recording(swinging: str) -> Recording:
    """40 requests: fetch_image 5 ms, preprocess (sizes on its span: 640x480, every third
    4000x3000), inference 100 ms; ``swinging`` takes 300 ms more on the large images."""
    spans: list[Span] = []
    resource = {semconv.SERVICE_NAME: "svc", semconv.SERVICE_INSTANCE_ID: "p1"}
    for i in range(40):
        large = i % 3 == 2
        w, h = (4000, 3000) if large else (640, 480)
        ms = {"fetch_image": 5.0, "preprocess": 30.0, "inference": 100.0 + 0.1 * (i % 5)}
        if large:
            ms[swinging] += 300.0
        t = T0 + i * 1000 * MS
        trace = f"{i:032x}"
        at = t
        kids = []
        for name, d in ms.items():
            attrs: dict[str, object] = ({semconv.IMAGE_WIDTH: w, semconv.IMAGE_HEIGHT: h}
                                        if name == "preprocess" else {})
            kids.append(Span(trace, name[:4], "r", name, at, at + int(d * MS), attrs, resource))  # type: ignore[arg-type]
            at += int(d * MS)
        spans.append(Span(trace, "r", None, "request", t, at, {semconv.REQUEST_SEQ: i + 1,
                                                                semconv.REQUEST_COLD_START: i == 0},
                          resource))
        spans += kids
    return Recording(spans=spans)


def test_a_preprocess_stage_reads_its_sizes() -> None:
    v = diagnose(_recording("preprocess")).verdict
    assert (v.cause, v.stage) == ("preprocess", "preprocess")
    assert any(e.startswith("preprocess time follows image pixels") for e in v.evidence), v.evidence
    assert advice_text.SIZE_UNKNOWN not in v.advice
    assert advice_text.CAP_SIZE in v.advice


def test_a_custom_stage_is_told_how_to_get_its_standard_evidence() -> None:
    v = diagnose(_recording("inference")).verdict
    assert (v.cause, v.stage) == ("other", "inference")
    assert advice_text.CUSTOM_IS_STANDARD in v.advice
