"""One table of settings, resolved as: argument > ``OTEL_STAGES_*`` > standard ``OTEL_*`` > default.

:func:`resolve` returns a frozen :class:`Settings`; a bad value raises :class:`ConfigurationError`
naming the setting, where the value came from and the value itself, so ``configure()`` fails fast
instead of the service failing later on the request path.
"""

from __future__ import annotations

import math
import os
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

DEFAULT_DATA_DIR = "otel-stages-data"
PROTOCOLS = ("grpc", "http/protobuf")


class ConfigurationError(ValueError):
    """A setting has a value otel_stages cannot use; the message names setting, source and value."""


def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _positive_float(min_s: float, max_s: float, why_min: str = "") -> Callable[[str], float]:
    """Parser for a duration in seconds, ``min_s <= value <= max_s``; ``why_min`` says why the
    floor is where it is (shown in the error)."""

    def parse(raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError("expected a number of seconds") from None
        if not math.isfinite(value) or value <= 0:
            raise ValueError("expected a finite number > 0")
        if value < min_s:
            raise ValueError(f"must be >= {min_s:g} s" + (f" ({why_min})" if why_min else ""))
        if value > max_s:
            raise ValueError(f"must be <= {max_s:g} s")
        return value

    parse.numeric = True  # type: ignore[attr-defined]  # numbers given as arguments are parsed too
    return parse


def _parse_protocol(raw: str) -> str:
    value = raw.strip().lower()
    if value == "http/json":
        raise ValueError("http/json is not supported by the Python OTLP exporters; use grpc or http/protobuf")
    if value not in PROTOCOLS:
        raise ValueError(f"expected one of {', '.join(PROTOCOLS)}")
    return value


def _parse_endpoint(raw: str) -> str | None:
    value = raw.strip()
    if not value:
        return None
    if "://" not in value:
        raise ValueError("expected a URL with a scheme, e.g. http://localhost:4317")
    try:
        url = urllib.parse.urlsplit(value)
    except ValueError as exc:  # e.g. an unbalanced IPv6 bracket
        raise ValueError(f"not a valid URL ({exc})") from None
    if url.scheme not in ("http", "https"):
        raise ValueError(f"scheme must be http or https, not {url.scheme!r} "
                         "(e.g. http://localhost:4318)")
    if not url.hostname:
        raise ValueError("no host in the URL (e.g. http://localhost:4318)")
    after_host = url.netloc.rpartition("@")[2].rpartition("]")[2]  # past userinfo and [IPv6]
    if ":" in after_host:  # a port was given: it must be a number in range
        raw_port = after_host.rpartition(":")[2]
        port = int(raw_port) if raw_port.isascii() and raw_port.isdigit() else None
        if port is None or not 1 <= port <= 65535:
            raise ValueError(f"port must be a number from 1 to 65535, got {raw_port!r}")
    return url.scheme + value[len(url.scheme):]  # scheme lower-cased (the SDK compares it)


def _parse_text(raw: str) -> str:
    value = raw.strip()
    if not value:
        raise ValueError("must not be empty")
    return value


def _positive_int(minimum: int) -> Callable[[str], int]:
    """Parser for a whole number ``>= minimum``."""

    def parse(raw: str) -> int:
        value = raw.strip()
        if not value.lstrip("-").isdigit():
            raise ValueError("expected a whole number")
        number = int(value)
        if number < minimum:
            raise ValueError(f"must be >= {minimum}")
        return number

    parse.numeric = True  # type: ignore[attr-defined]
    return parse


def _parse_key_list(raw: str) -> tuple[str, ...]:
    """Comma-separated names (whitespace around each ignored, empty items skipped)."""
    keys = tuple(k.strip() for k in raw.split(",") if k.strip())
    bad = [k for k in keys if any(c in k for c in "=&#?/ ")]
    if bad:
        raise ValueError(f"not a query parameter name: {bad[0]!r}")
    return keys


def _parse_gpu_mode(raw: str) -> str:
    value = raw.strip().lower()
    if value not in ("auto", "on", "off"):
        raise ValueError("expected auto, on or off")
    return value


SPAN_MODES = ("live", "deferred")


def _parse_span_mode(raw: str) -> str:
    value = raw.strip().lower()
    if value not in SPAN_MODES:
        raise ValueError("expected live or deferred")
    return value


def _fraction(raw: str) -> float:
    """Parser for a ratio from 0 to 1 inclusive (numbers given as arguments are parsed too)."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("expected a number from 0 to 1") from None
    if not 0.0 <= value <= 1.0:  # also refuses nan
        raise ValueError("expected a number from 0 to 1")
    return value


_fraction.numeric = True  # type: ignore[attr-defined]


def _milliseconds(raw: str) -> float:
    """Parser for a latency threshold in ms, > 0 and at most one hour."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError("expected a number of milliseconds") from None
    if not math.isfinite(value) or not 0 < value <= 3_600_000:
        raise ValueError("expected a number of milliseconds > 0 and <= 3600000")
    return value


_milliseconds.numeric = True  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Setting:
    """One row of the settings table.

    ``env`` lists the environment variables consulted, highest priority first
    (``OTEL_STAGES_*`` before standard ``OTEL_*``). ``parse`` turns a string into the value and
    raises ``ValueError`` with a reason when it can't.
    """

    name: str
    env: tuple[str, ...]
    default: Any
    parse: Callable[[str], Any]
    doc: str


SETTINGS: tuple[Setting, ...] = (
    Setting("enabled", ("OTEL_STAGES_ENABLED",), True, _parse_bool,
            "false makes every stage a near-free no-op (OTEL_SDK_DISABLED=true does too)"),
    Setting("service_name", ("OTEL_STAGES_SERVICE_NAME", "OTEL_SERVICE_NAME"), "otel-stages",
            _parse_text, "resource attribute service.name"),
    Setting("data_dir", ("OTEL_STAGES_DATA_DIR",), DEFAULT_DATA_DIR, _parse_text,
            "folder for the embedded OTLP/JSON lines files (used when no OTLP endpoint is set)"),
    Setting("endpoint", ("OTEL_STAGES_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"), None,
            _parse_endpoint, "OTLP collector URL; unset = write OTLP/JSON files to data_dir"),
    Setting("protocol", ("OTEL_STAGES_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"),
            "http/protobuf", _parse_protocol, "OTLP transport: grpc or http/protobuf"),
    Setting("log_requests", ("OTEL_STAGES_LOG_REQUESTS",), False, _parse_bool,
            "emit one JSON log line per finished request via logging (logger otel_stages.requests)"),
    Setting("metric_export_interval_s", ("OTEL_STAGES_METRIC_EXPORT_INTERVAL_S",), 10.0,
            _positive_float(0.1, 3600.0, "each export serialises and writes every metric; "
                                        "faster than 10 per second is export overhead, not data"),
            "seconds between metric exports (0.1 to 3600)"),
    Setting("span_mode", ("OTEL_STAGES_SPAN_MODE",), "live", _parse_span_mode,
            "live: spans made on the request thread; deferred: the request thread records times "
            "and attributes, spans are built off it (other libraries' spans cannot nest under a "
            "deferred stage: see otel_stages.deferred)"),
    Setting("gpu", ("OTEL_STAGES_GPU",), "auto", _parse_gpu_mode,
            "GPU sampling via NVML: auto (if available), on (fail configure() without it), off"),
    Setting("gpu_interval_s", ("OTEL_STAGES_GPU_INTERVAL_S",), 1.0,
            _positive_float(0.05, 3600.0, "NVML's utilization ring holds ~1/6 s periods and every "
                                         "pass costs NVML calls per GPU; faster passes add cost, "
                                         "not samples"),
            "seconds between GPU sampler passes, 0.05 to 3600 (every NVML utilization sample is kept)"),
    # --- serving (thread pools, sampling) ---
    Setting("propagate_context", ("OTEL_STAGES_PROPAGATE_CONTEXT",), True, _parse_bool,
            "keep the request's trace context in work submitted to thread pools "
            "(concurrent.futures, loop.run_in_executor, asyncio.to_thread, threading.Thread)"),
    Setting("sample_ratio", ("OTEL_STAGES_SAMPLE_RATIO",), 1.0, _fraction,
            "share of traces kept, 0 to 1; below 1, cold-start, failed and slow requests are kept "
            "all the same (decided in-process when the request ends)"),
    Setting("slow_request_ms", ("OTEL_STAGES_SLOW_REQUEST_MS",), 1000.0, _milliseconds,
            "with sample_ratio < 1: a request (or local root span) at least this long is kept"),
    Setting("gpu_read_timeout_s", ("OTEL_STAGES_GPU_READ_TIMEOUT_S",), 2.0,
            _positive_float(0.01, 600.0),
            "an NVML reading still running after this many seconds is abandoned (logged once); "
            "that reading is skipped until it returns, other readings and GPUs go on"),
    Setting("shutdown_timeout_s", ("OTEL_STAGES_SHUTDOWN_TIMEOUT_S",), 5.0,
            _positive_float(0.01, 3600.0),
            "most seconds Telemetry.shutdown() and process exit wait for the last export; what is "
            "not delivered by then is counted as dropped"),
    Setting("attribute_value_length_limit",
            ("OTEL_STAGES_ATTRIBUTE_VALUE_LENGTH_LIMIT", "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT",
             "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"), 4096, _positive_int(1),
            "characters kept of each string attribute, status and exception message otel_stages "
            "writes (longer ones end with a truncation marker giving the original length)"),
    Setting("signals", ("OTEL_STAGES_SIGNALS",), True, _parse_bool,
            "why a stage was slow: per-stage thread CPU time, GC pauses, asyncio event-loop lag, and "
            "the cgroup's CPU quota and throttled time as metrics (false turns all of it off)"),
    Setting("run_queue", ("OTEL_STAGES_RUN_QUEUE",), False, _parse_bool,
            "with signals: per-stage run-queue wait of the stage's thread (Linux "
            "/proc/thread-self/schedstat run_delay, otel_stages.thread.run_queue_wait_ms): tells "
            "waiting for a core from waiting on I/O, a lock or a sleep; two reads (a few us) a stage"),
    Setting("redact_query_keys", ("OTEL_STAGES_REDACT_QUERY_KEYS",), (), _parse_key_list,
            "extra URL query parameter names whose values are redacted (comma-separated), on top "
            "of the built-in list (OpenTelemetry's plus token, api_key, password, ...)"),
)

_BY_NAME = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class Settings:
    """Resolved settings (see :data:`SETTINGS` for sources and meaning)."""

    enabled: bool
    service_name: str
    data_dir: str
    endpoint: str | None
    protocol: str
    log_requests: bool
    metric_export_interval_s: float
    gpu: str = "auto"
    gpu_interval_s: float = 1.0
    propagate_context: bool = True
    sample_ratio: float = 1.0
    slow_request_ms: float = 1000.0
    gpu_read_timeout_s: float = 2.0
    shutdown_timeout_s: float = 5.0
    attribute_value_length_limit: int = 4096
    redact_query_keys: tuple[str, ...] = ()
    span_mode: str = "live"
    signals: bool = True
    run_queue: bool = False

    @property
    def data_path(self) -> Path:
        """``data_dir`` as a :class:`~pathlib.Path`."""
        return Path(self.data_dir)


def _sdk_disabled(environ: Mapping[str, str]) -> bool:
    return environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def resolve(arguments: Mapping[str, Any] | None = None,
            environ: Mapping[str, str] | None = None) -> Settings:
    """Resolve every setting: explicit argument (not ``None``) > env vars in table order > default.

    Raises :class:`ConfigurationError` for an unknown argument name or an unparsable value,
    e.g. ``OTEL_EXPORTER_OTLP_PROTOCOL='udp' (setting protocol): expected one of grpc, ...``.
    """
    arguments = dict(arguments or {})
    environ = os.environ if environ is None else environ
    unknown = set(arguments) - set(_BY_NAME)
    if unknown:
        raise ConfigurationError(f"unknown setting(s): {', '.join(sorted(unknown))}; "
                                 f"known: {', '.join(_BY_NAME)}")
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        values[setting.name] = _resolve_one(setting, arguments.get(setting.name), environ)
    if _sdk_disabled(environ) and arguments.get("enabled") is None:
        values["enabled"] = False  # the standard kill switch wins over our own default
    return Settings(**{f.name: values[f.name] for f in fields(Settings)})


def _resolve_one(setting: Setting, argument: Any, environ: Mapping[str, str]) -> Any:
    if argument is not None:
        source = f"argument {setting.name}="
        if isinstance(argument, (list, tuple, set, frozenset)) and setting.parse is _parse_key_list:
            argument = ",".join(str(a) for a in argument)
        if setting.parse is _parse_bool and isinstance(argument, bool):
            return argument
        if setting.parse is _parse_gpu_mode and isinstance(argument, bool):
            return "on" if argument else "off"  # gpu=True / gpu=False, as documented in gpu.session
        if isinstance(argument, str) or (getattr(setting.parse, "numeric", False)
                                         and not isinstance(argument, bool)):
            return _parse(setting, str(argument), source)
        if isinstance(argument, os.PathLike) and setting.parse is _parse_text:
            return argument  # a folder given as a Path
        wanted = "True or False" if setting.parse is _parse_bool else (
            "a number" if getattr(setting.parse, "numeric", False) else "a string")
        raise ConfigurationError(f"{source}{argument!r} ({_names(setting)}): expected {wanted},"
                                 f" got {type(argument).__name__}")
    for var in setting.env:
        raw = environ.get(var)
        if raw is not None and raw.strip() != "":
            return _parse(setting, raw, f"{var}=")
    return setting.default


def _names(setting: Setting) -> str:
    """``setting NAME, OTEL_STAGES_NAME``: the argument and the environment variable."""
    return f"setting {setting.name}, {setting.env[0]}" if setting.env else f"setting {setting.name}"


def _parse(setting: Setting, raw: str, source: str) -> Any:
    try:
        return setting.parse(raw)
    except ValueError as exc:
        names = _names(setting) if source.startswith("argument ") else f"setting {setting.name}"
        raise ConfigurationError(f"{source}{raw!r} ({names}): {exc}") from None
