"""Pure analysis: load recorded telemetry -> per-stage statistics -> verdict.

``load_paths(paths)`` reads OTLP/JSON files or folders into a :class:`Recording`;
``diagnose(recording, baseline=None)`` returns a :class:`Report` whose ``to_dict()`` is the
``otel-stages report --json`` contract. The diagnosis rules themselves work on aggregates
(:mod:`otel_stages.analysis.figures`, :func:`otel_stages.analysis.decision.decide`), so every
source feeds the same rules.
"""

from otel_stages.analysis.diagnosis import diagnose
from otel_stages.analysis.model import MetricPoint, Recording, Span
from otel_stages.analysis.otlp_json import load_paths
from otel_stages.analysis.report import Report

__all__ = ["MetricPoint", "Recording", "Report", "Span", "diagnose", "load_paths"]
