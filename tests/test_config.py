"""Settings table precedence and fail-fast errors naming the setting and the value."""

from __future__ import annotations

from pathlib import Path

import pytest

from otel_stages.config import ConfigurationError, resolve


def test_defaults():
    s = resolve({}, environ={})
    assert s.enabled is True
    assert s.endpoint is None
    assert s.protocol == "http/protobuf"
    assert s.data_dir == "otel-stages-data"
    assert s.log_requests is False


def test_precedence_argument_over_stages_env_over_otel_env():
    env = {"OTEL_SERVICE_NAME": "from-otel", "OTEL_STAGES_SERVICE_NAME": "from-stages"}
    assert resolve({}, environ={"OTEL_SERVICE_NAME": "from-otel"}).service_name == "from-otel"
    assert resolve({}, environ=env).service_name == "from-stages"
    assert resolve({"service_name": "from-arg"}, environ=env).service_name == "from-arg"


def test_sdk_disabled_switch():
    assert resolve({}, environ={"OTEL_SDK_DISABLED": "true"}).enabled is False
    assert resolve({}, environ={"OTEL_STAGES_ENABLED": "false"}).enabled is False
    assert resolve({"enabled": True}, environ={"OTEL_SDK_DISABLED": "true"}).enabled is True


@pytest.mark.parametrize(
    "environ, needle",
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "udp"}, "OTEL_EXPORTER_OTLP_PROTOCOL='udp' (setting protocol)"),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "http/json is not supported"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4317"}, "OTEL_EXPORTER_OTLP_ENDPOINT='localhost:4317' (setting endpoint)"),
        ({"OTEL_STAGES_ENABLED": "maybe"}, "OTEL_STAGES_ENABLED='maybe' (setting enabled)"),
        ({"OTEL_STAGES_METRIC_EXPORT_INTERVAL_S": "-1"}, "setting metric_export_interval_s"),
    ],
)
def test_bad_values_name_setting_source_and_value(environ, needle):
    with pytest.raises(ConfigurationError) as info:
        resolve({}, environ=environ)
    assert needle in str(info.value)


def test_bad_argument_named_as_argument():
    with pytest.raises(ConfigurationError, match=r"argument protocol='smtp'"):
        resolve({"protocol": "smtp"}, environ={})
    with pytest.raises(ConfigurationError, match="unknown setting"):
        resolve({"colour": "red"}, environ={})


@pytest.mark.parametrize(
    "endpoint, reason",
    [
        ("ftp://x:1", "scheme must be http or https, not 'ftp'"),
        ("grpc://collector:4317", "scheme must be http or https"),
        ("http://", "no host"),
        ("http://:4317", "no host"),
        ("http://localhost:abc", "port must be a number from 1 to 65535, got 'abc'"),
        ("http://localhost:", "port must be a number from 1 to 65535, got ''"),
        ("http://localhost:0", "got '0'"),
        ("http://localhost:70000", "got '70000'"),
        ("http://[::1", "not a valid URL"),
    ],
)
def test_endpoint_must_be_an_http_url_with_host_and_numeric_port(endpoint, reason):
    with pytest.raises(ConfigurationError) as info:
        resolve({}, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    message = str(info.value)
    assert message.startswith(f"OTEL_EXPORTER_OTLP_ENDPOINT={endpoint!r} (setting endpoint): ")
    assert reason in message
    with pytest.raises(ConfigurationError, match=r"argument endpoint="):
        resolve({"endpoint": endpoint}, environ={})


@pytest.mark.parametrize("endpoint", ["http://localhost:4318", "https://collector.example/otlp",
                                      "http://[::1]:4317", "http://10.0.0.5", "HTTP://Host:4317"])
def test_good_endpoints_pass(endpoint):
    value = resolve({}, environ={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}).endpoint
    assert value.lower() == endpoint.lower() and value.startswith(("http://", "https://"))


@pytest.mark.parametrize(
    "var, raw, needle",
    [
        ("OTEL_STAGES_GPU_INTERVAL_S", "1e-9", "must be >= 0.05 s (NVML's utilization ring"),
        ("OTEL_STAGES_GPU_INTERVAL_S", "0.049", "must be >= 0.05 s"),
        ("OTEL_STAGES_GPU_INTERVAL_S", "86400", "must be <= 3600 s"),
        ("OTEL_STAGES_METRIC_EXPORT_INTERVAL_S", "0.0001", "must be >= 0.1 s (each export"),
        ("OTEL_STAGES_METRIC_EXPORT_INTERVAL_S", "1e9", "must be <= 3600 s"),
        ("OTEL_STAGES_METRIC_EXPORT_INTERVAL_S", "inf", "finite"),
        ("OTEL_STAGES_GPU_INTERVAL_S", "soon", "expected a number of seconds"),
    ],
)
def test_intervals_have_floors_and_ceilings_with_a_reason(var, raw, needle):
    with pytest.raises(ConfigurationError) as info:
        resolve({}, environ={var: raw})
    assert str(info.value).startswith(f"{var}={raw!r} (setting ")
    assert needle in str(info.value)


def test_interval_bounds_apply_to_arguments_and_accept_the_edges():
    with pytest.raises(ConfigurationError, match=r"argument gpu_interval_s=.*must be >= 0.05 s"):
        resolve({"gpu_interval_s": 1e-9}, environ={})
    with pytest.raises(ConfigurationError, match=r"argument metric_export_interval_s=.*>= 0.1 s"):
        resolve({"metric_export_interval_s": 0.0001}, environ={})
    edges = resolve({"gpu_interval_s": 0.05, "metric_export_interval_s": 3600}, environ={})
    assert edges.gpu_interval_s == 0.05 and edges.metric_export_interval_s == 3600.0


def test_reliability_settings_defaults_and_sources():
    s = resolve({}, environ={})
    assert s.shutdown_timeout_s == 5.0
    assert s.attribute_value_length_limit == 4096
    assert s.redact_query_keys == ()
    assert s.gpu_read_timeout_s == 2.0
    env = {"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "300", "OTEL_STAGES_REDACT_QUERY_KEYS": " hint , sid ",
           "OTEL_STAGES_SHUTDOWN_TIMEOUT_S": "1.5"}
    s = resolve({}, environ=env)
    assert (s.attribute_value_length_limit, s.redact_query_keys, s.shutdown_timeout_s) == (300, ("hint", "sid"), 1.5)
    assert resolve({"attribute_value_length_limit": 50}, environ=env).attribute_value_length_limit == 50
    assert resolve({"redact_query_keys": ["a", "b"]}, environ={}).redact_query_keys == ("a", "b")


@pytest.mark.parametrize("environ, needle", [
    ({"OTEL_STAGES_SHUTDOWN_TIMEOUT_S": "0"}, "OTEL_STAGES_SHUTDOWN_TIMEOUT_S='0' (setting shutdown_timeout_s)"),
    ({"OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "lots"}, "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT='lots' (setting attribute_value_length_limit): expected a whole number"),
    ({"OTEL_STAGES_ATTRIBUTE_VALUE_LENGTH_LIMIT": "0"}, "must be >= 1"),
    ({"OTEL_STAGES_REDACT_QUERY_KEYS": "a=b"}, "not a query parameter name: 'a=b'"),
    ({"OTEL_STAGES_GPU_READ_TIMEOUT_S": "-2"}, "setting gpu_read_timeout_s"),
])
def test_reliability_settings_fail_fast(environ, needle):
    with pytest.raises(ConfigurationError) as info:
        resolve({}, environ=environ)
    assert needle in str(info.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"span_mode": 1}, "argument span_mode=1 (setting span_mode, OTEL_STAGES_SPAN_MODE): expected a string, got int"),
    ({"span_mode": ["deferred"]}, "expected a string, got list"),
    ({"signals": 0}, "argument signals=0 (setting signals, OTEL_STAGES_SIGNALS): expected True or False, got int"),
    ({"enabled": 0}, "expected True or False, got int"),
    ({"gpu": 1}, "argument gpu=1 (setting gpu, OTEL_STAGES_GPU): expected a string, got int"),
    ({"sample_ratio": True}, "expected a number, got bool"),
    ({"span_mode": "fast"}, "argument span_mode='fast' (setting span_mode, OTEL_STAGES_SPAN_MODE): "),
])
def test_an_argument_of_the_wrong_type_fails_naming_setting_variable_and_value(kwargs, message):
    with pytest.raises(ConfigurationError) as info:
        resolve(kwargs, environ={})
    assert message in str(info.value)


def test_arguments_of_the_right_type_pass():
    settings = resolve({"enabled": False, "signals": True, "span_mode": "deferred",
                        "sample_ratio": 1, "data_dir": Path("/tmp/x"), "redact_query_keys": ["sig"]},
                       environ={})
    assert (settings.enabled, settings.signals, settings.span_mode) == (False, True, "deferred")
    assert resolve({"gpu": False}, environ={}).gpu == "off" and resolve({"gpu": True}, environ={}).gpu == "on"
