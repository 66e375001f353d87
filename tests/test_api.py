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


def test_readme_documents_every_setting_and_ci_runs_the_readme_test_command():
    from pathlib import Path

    from otel_stages.config import SETTINGS

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    missing = [var for s in SETTINGS for var in s.env if f"`{var}" not in readme]
    assert missing == []
    commands = [line for line in readme.splitlines() if line.startswith("python3 -m venv")]
    assert len(commands) == 2 and "otel-stages demo" in commands[0]
    assert commands[1] in (root / ".ci" / "run").read_text()
