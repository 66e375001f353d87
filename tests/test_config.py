"""Settings table precedence and fail-fast errors naming the setting and the value."""

from __future__ import annotations

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
