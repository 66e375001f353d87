"""The public surface is pinned, and instrumentation code stays on the OpenTelemetry API."""

from __future__ import annotations

import subprocess
import sys

import otel_stages


def test_all_is_pinned():
    assert otel_stages.__all__ == [
        "Batch",
        "ConfigurationError",
        "QueueToken",
        "Telemetry",
        "configure",
        "dequeue",
        "dequeue_batch",
        "enqueue_token",
        "mark_cold_start",
        "record_error",
        "request",
        "stage",
    ]
    for name in otel_stages.__all__:
        assert getattr(otel_stages, name) is not None


def test_instrumentation_does_not_import_the_sdk():
    code = (
        "import sys, otel_stages, otel_stages.imaging, otel_stages.handoff;"
        "import otel_stages as o\n"
        "with o.request():\n"
        "    with o.stage('decode'): pass\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
