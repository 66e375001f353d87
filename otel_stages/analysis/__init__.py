"""Pure analysis: load recorded telemetry -> per-stage statistics -> verdict.

``load_paths(paths)`` reads trace files or folders (OTLP/JSON, Jaeger, Tempo; gzip or zstd; see
:mod:`otel_stages.analysis.formats`) into a :class:`Recording`, streaming (``selection=`` keeps
only the span attributes the analysis reads, :mod:`otel_stages.analysis.selection`; ``progress=``
is told the bytes read, :mod:`otel_stages.analysis.files`);
``diagnose(recording, baseline=None)`` returns a :class:`Report` whose ``to_dict()`` is the
``otel-stages report --json`` contract. The diagnosis rules themselves work on aggregates
(:mod:`otel_stages.analysis.figures`, :func:`otel_stages.analysis.decision.decide`), so every
source feeds the same rules.
"""

from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.files import load_paths
from otel_stages.analysis.model import MetricPoint, Recording, Span
from otel_stages.analysis.report import Report

__all__ = ["MetricPoint", "Recording", "Report", "Span", "diagnose", "load_paths"]
