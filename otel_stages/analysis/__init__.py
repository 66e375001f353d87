"""Pure analysis: load recorded telemetry -> per-stage statistics -> verdict.

``load_paths(paths)`` reads trace files or folders (OTLP/JSON, Jaeger, Tempo; gzip or zstd; see
:mod:`otel_stages.analysis.formats`) into a :class:`Recording`;
``diagnose(telemetry, baseline=None)`` returns a :class:`Report` whose ``to_dict()`` is the
``otel-stages report --json`` contract.
"""

from otel_stages.analysis.files import load_paths
from otel_stages.analysis.model import MetricPoint, Recording, Span
from otel_stages.analysis.report import Report, diagnose

__all__ = ["MetricPoint", "Recording", "Report", "Span", "diagnose", "load_paths"]
