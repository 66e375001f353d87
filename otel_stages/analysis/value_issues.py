"""Attribute values a report reads but cannot use, counted so that none is dropped silently.

The readers (:func:`otel_stages.analysis.requests.usable_bool`,
:func:`~otel_stages.analysis.requests.positive_int`,
:func:`otel_stages.analysis.gpu.utilization_reading`) read a value they cannot use as absent:
``request.cold_start`` written ``"True"`` (Python's ``str(True)``) marks nothing, a
``request.seq`` of 0 orders nothing, a ``gpu.utilization.mean`` of ``" 0.93"`` or NVML's -1 is no
GPU reading, an ``image.width`` of 0 or ``" 640"`` is no size. Each such value changes what the
report can say (which request is cold, whether the GPU was busy, which input a request had), so
each kind is counted over the requests and becomes one line of the report's ``problems``. The
ClickHouse SQL counts the same spans (:func:`otel_stages.analysis.clickhouse_issues.issues_sql`)
and prints the same lines.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from otel_stages import semconv
from otel_stages.analysis.gpu import MAX_SAMPLE_COUNT, MAX_UTILIZATION_READING, utilization_reading
from otel_stages.analysis.requests import Request, positive_int, usable_bool


@dataclass(frozen=True)
class UnreadValues:
    """Counts of spans whose attribute is present but not usable: ``cold_start`` request spans
    (``request.cold_start`` neither a bool nor ``"true"`` / ``"false"``), ``seq`` request spans
    (``request.seq`` not an int above 0), ``gpu_utilization`` forward spans (``gpu.utilization.mean``
    with ``gpu.sample_count`` no reading), ``image_size`` decode spans (``image.width`` or
    ``image.height`` not an int above 0)."""

    cold_start: int = 0
    seq: int = 0
    gpu_utilization: int = 0
    image_size: int = 0

    def problems(self) -> list[str]:
        """One sentence per kind with a count above 0 (none: ``[]``)."""
        out = []
        if self.cold_start:
            out.append(
                f"{semconv.REQUEST_COLD_START}: {_spans(self.cold_start, 'request')} a value that is"
                " neither a bool nor the text 'true' / 'false' (Python's str(True) writes 'True');"
                " read as absent: such a request is not marked cold, and a process with no readable"
                " mark takes its cold request from request.seq or the order of requests")
        if self.seq:
            out.append(
                f"{semconv.REQUEST_SEQ}: {_spans(self.seq, 'request')} a value that is not an int"
                " above 0 (the count starts at 1); read as absent")
        if self.gpu_utilization:
            out.append(
                f"{semconv.GPU_UTILIZATION_MEAN}: {_spans(self.gpu_utilization, 'forward')} a value"
                f" that is no reading (not a number, outside 0..{MAX_UTILIZATION_READING:g}, or"
                f" {semconv.GPU_SAMPLE_COUNT} not an int in 1..{MAX_SAMPLE_COUNT:,}); left out of the GPU"
                " evidence")
        if self.image_size:
            out.append(
                f"{semconv.IMAGE_WIDTH} / {semconv.IMAGE_HEIGHT}: {_spans(self.image_size, 'decode')}"
                " a value that is not an int above 0 (a width of 0, a size written as ' 640');"
                " read as absent, so a request without another usable size has an unknown input")
        return out


def _spans(n: int, name: str) -> str:
    return f"{n} {name} span{' carries' if n == 1 else 's carry'}"


def unread_values(requests: Iterable[Request]) -> UnreadValues:
    """The :class:`UnreadValues` of ``requests`` (their request spans' attributes and their
    ``forward`` and ``decode`` stage spans). Linear; a dict lookup or two per span."""
    cold = seq = gpu = size = 0
    cold_key, seq_key, gpu_key = (semconv.REQUEST_COLD_START, semconv.REQUEST_SEQ,
                                  semconv.GPU_UTILIZATION_MEAN)
    width_key, height_key = semconv.IMAGE_WIDTH, semconv.IMAGE_HEIGHT
    forward, decode = semconv.STAGE_FORWARD, semconv.STAGE_DECODE
    for r in requests:
        attrs = r.attributes
        if cold_key in attrs and usable_bool(attrs[cold_key]) is None:
            cold += 1
        if seq_key in attrs and positive_int(attrs[seq_key]) is None:
            seq += 1
        for span in r.spans:
            if (span.name == forward and gpu_key in span.attributes
                    and utilization_reading(span.attributes) is None):
                gpu += 1
            elif span.name == decode and (
                    (width_key in span.attributes and positive_int(span.attributes[width_key]) is None)
                    or (height_key in span.attributes
                        and positive_int(span.attributes[height_key]) is None)):
                size += 1
    return UnreadValues(cold_start=cold, seq=seq, gpu_utilization=gpu, image_size=size)
