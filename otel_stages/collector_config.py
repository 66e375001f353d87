"""The bundled OpenTelemetry Collector configuration (contrib distribution).

The YAML ships inside the package (``otel_stages/data/collector.yaml``) so that it is available
from an installed wheel; ``collector_config/otel-stages.yaml`` in the repository is a byte-identical
copy for people browsing the source. ``otel-stages collector-config`` prints it.
"""

from __future__ import annotations

from importlib import resources

#: otelcol-contrib release the bundled config is written and checked for.
COLLECTOR_CONTRIB_VERSION = "0.157.0"

_RESOURCE = "data/collector.yaml"


def collector_config_text() -> str:
    """Return the bundled collector config as text (UTF-8, exactly as shipped)."""
    return resources.files("otel_stages").joinpath(_RESOURCE).read_text(encoding="utf-8")
