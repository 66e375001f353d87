"""Checks for what users deploy: collector config, compose stack, alert rules, dashboard, k8s.

Real tools, no mocks: ``promtool`` (Debian package ``prometheus``) checks and unit-tests the alert
rules and parses every PromQL expression of the dashboard; ``docker compose`` / ``docker-compose``
validates the compose file. A missing tool skips its test with the reason, except when the ``CI``
environment variable is set: then a missing tool FAILS, so CI cannot go green without the checks.
``.ci/install-tools.sh`` installs the tools.

There is no collector binary here, so the collector config is checked structurally (every
component referenced is defined, names valid for the pinned contrib release, connectors wired
both ways, memory_limiter first, env placeholders well formed) plus the properties this project
relies on. Each checker has a test proving it reports a broken input.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from otel_stages import semconv
from otel_stages.collector_config import COLLECTOR_CONTRIB_VERSION, collector_config_text

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
BUNDLED = ROOT / "otel_stages" / "data" / "collector.yaml"
REPO_COPY = ROOT / "collector_config" / "otel-stages.yaml"
OVERLAY = DEPLOY / "collector" / "compose-overlay.yaml"
CLICKHOUSE_COMPOSE = DEPLOY / "clickhouse" / "compose.yaml"
CLICKHOUSE_OVERLAY = DEPLOY / "clickhouse" / "clickhouse-overlay.yaml"
RULES = DEPLOY / "prometheus" / "rules.yaml"
RULES_TEST = DEPLOY / "prometheus" / "rules_test.yaml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "otel-stages.json"
DATASOURCES = DEPLOY / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
COMPOSE = DEPLOY / "compose.yaml"


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


try:
    import yaml
except ImportError:  # pragma: no cover - depends on the environment
    if _ci():
        raise
    pytest.skip("PyYAML is not installed (pip install -e '.[test]')", allow_module_level=True)


def _missing(what: str) -> None:
    msg = f"{what} is not installed (run .ci/install-tools.sh)"
    if _ci():
        pytest.fail(f"{msg}; CI is set, so this check must run", pytrace=False)
    pytest.skip(msg)


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        _missing("promtool (Debian package 'prometheus')")
    return path


@pytest.fixture(scope="module")
def compose_cmd() -> list[str]:
    """`docker compose` (v2 plugin) when it works, else the standalone `docker-compose`."""
    docker = shutil.which("docker")
    if docker:
        probe = subprocess.run([docker, "compose", "version"], capture_output=True, text=True)
        if probe.returncode == 0:
            return [docker, "compose"]
    standalone = shutil.which("docker-compose")
    if standalone is None:
        _missing("docker compose / docker-compose (Debian package 'docker-compose')")
    return [standalone]


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=300)


# --------------------------------------------------------------------------------------------
# Collector config: structural checker
# --------------------------------------------------------------------------------------------

#: Component type names valid in otelcol-contrib 0.157.0, per kind. Deliberately short: the names
#: this project uses plus a few whose current spelling is certain for that release (many contrib
#: components are being renamed to lower_snake_case). Before using another component, confirm its
#: name with `otelcol-contrib components` and add it here.
ALLOWED: dict[str, set[str]] = {
    "receivers": {"otlp", "nop"},
    "processors": {
        "memory_limiter", "batch", "tail_sampling", "probabilistic_sampler",
        "resource", "attributes", "filter", "transform",
    },
    "exporters": {"otlp_grpc", "otlp_http", "debug", "nop", "clickhouse"},
    "connectors": {"span_metrics", "forward"},
    "extensions": {"health_check", "zpages", "pprof"},
}
DEPRECATED: dict[tuple[str, str], str] = {
    ("connectors", "spanmetrics"): "span_metrics",
    ("exporters", "otlp"): "otlp_grpc",
    ("exporters", "otlphttp"): "otlp_http",
}
#: connector type -> (signal of the pipeline it exports from, signal it feeds); None = same signal
CONNECTOR_SIGNALS: dict[str, tuple[str, str] | None] = {
    "span_metrics": ("traces", "metrics"),
    "forward": None,
}
SIGNALS = {"traces", "metrics", "logs"}
# ${env:NAME} or ${env:NAME:-default}; `$$` is the collector's escape for a literal `$`.
_ENV_OK = re.compile(r"\$\{env:[A-Za-z_][A-Za-z0-9_]*(?::-[^}]*)?\}")


def _type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def _strings(node: Any) -> list[str]:
    """Every string (keys and values) in a parsed YAML tree."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for k, v in node.items() for s in _strings(k) + _strings(v)]
    if isinstance(node, list):
        return [s for item in node for s in _strings(item)]
    return []


def check_placeholders(cfg: Any) -> list[str]:
    problems = []
    for s in _strings(cfg):
        rest = _ENV_OK.sub("", s.replace("$$", ""))
        if "$" in rest:
            problems.append(
                f"malformed env placeholder in {s!r}: use ${{env:NAME}} or ${{env:NAME:-default}}"
            )
    return problems


def check_collector_config(cfg: dict[str, Any]) -> list[str]:
    """Return the problems otelcol-contrib would reject (or silently misroute) in ``cfg``."""
    problems: list[str] = []
    kinds = ("receivers", "processors", "exporters", "connectors", "extensions")
    for key in cfg:
        if key not in (*kinds, "service"):
            problems.append(f"unknown top-level key {key!r}")
    defined = {kind: set((cfg.get(kind) or {}).keys()) for kind in kinds}
    for kind in kinds:
        for cid in defined[kind]:
            ctype = _type(cid)
            if (kind, ctype) in DEPRECATED:
                problems.append(
                    f"{kind[:-1]} {cid!r}: {ctype!r} is a deprecated alias in "
                    f"{COLLECTOR_CONTRIB_VERSION}; use {DEPRECATED[(kind, ctype)]!r}"
                )
            elif ctype not in ALLOWED[kind]:
                problems.append(f"{kind[:-1]} {cid!r}: unknown type {ctype!r}")

    service = cfg.get("service") or {}
    for ext in service.get("extensions") or []:
        if ext not in defined["extensions"]:
            problems.append(f"service.extensions: {ext!r} is not defined under extensions")
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        problems.append("service.pipelines is empty")

    used: dict[str, set[str]] = {kind: set() for kind in kinds}
    used["extensions"] = set(service.get("extensions") or [])
    connector_from: dict[str, set[str]] = {}  # connector -> signals of pipelines exporting to it
    connector_to: dict[str, set[str]] = {}  # connector -> signals of pipelines it feeds
    for pid, pipe in pipelines.items():
        signal = _type(pid)
        if signal not in SIGNALS:
            problems.append(f"pipeline {pid!r}: unknown signal {signal!r}")
        pipe = pipe or {}
        receivers = pipe.get("receivers") or []
        processors = pipe.get("processors") or []
        exporters = pipe.get("exporters") or []
        if not receivers or not exporters:
            problems.append(f"pipeline {pid!r}: needs at least one receiver and one exporter")
        for r in receivers:
            if r in defined["receivers"]:
                used["receivers"].add(r)
            elif r in defined["connectors"]:
                used["connectors"].add(r)
                connector_to.setdefault(r, set()).add(signal)
            else:
                problems.append(f"pipeline {pid!r}: receiver {r!r} is not defined")
        for p in processors:
            if p in defined["processors"]:
                used["processors"].add(p)
            else:
                problems.append(f"pipeline {pid!r}: processor {p!r} is not defined")
        for e in exporters:
            if e in defined["exporters"]:
                used["exporters"].add(e)
            elif e in defined["connectors"]:
                used["connectors"].add(e)
                connector_from.setdefault(e, set()).add(signal)
            else:
                problems.append(f"pipeline {pid!r}: exporter {e!r} is not defined")
        if not processors or _type(processors[0]) != "memory_limiter":
            problems.append(f"pipeline {pid!r}: memory_limiter must be the first processor")
        if any(_type(p) == "batch" for p in processors[:-1]):
            problems.append(f"pipeline {pid!r}: batch must be the last processor")

    for kind in kinds:
        for cid in sorted(defined[kind] - used[kind]):
            problems.append(f"{kind[:-1]} {cid!r} is defined but not used in any pipeline")
    for cid in sorted(defined["connectors"]):
        src, dst = connector_from.get(cid, set()), connector_to.get(cid, set())
        if cid in used["connectors"] and (not src or not dst):
            problems.append(
                f"connector {cid!r} must be an exporter in one pipeline and a receiver in another"
            )
            continue
        expected = CONNECTOR_SIGNALS.get(_type(cid))
        if expected and (src - {expected[0]} or dst - {expected[1]}):
            problems.append(
                f"connector {cid!r} connects {sorted(src)} -> {sorted(dst)}; "
                f"it supports {expected[0]} -> {expected[1]}"
            )
    problems.extend(check_placeholders(cfg))
    return problems


def check_otel_stages_contract(cfg: dict[str, Any]) -> list[str]:
    """What otel_stages needs from the config beyond it being valid."""
    problems: list[str] = []
    pipelines = cfg["service"]["pipelines"]
    span_metrics = [c for c in cfg.get("connectors", {}) if _type(c) == "span_metrics"]
    if len(span_metrics) != 1:
        return [f"expected one span_metrics connector, found {span_metrics}"]
    sm_id = span_metrics[0]
    sm = cfg["connectors"][sm_id] or {}
    if (sm.get("histogram") or {}).get("unit") != "ms":
        problems.append("span_metrics: histogram.unit must be pinned to ms")
    if not (sm.get("exemplars") or {}).get("enabled"):
        problems.append("span_metrics: exemplars must be enabled")
    if sm.get("namespace") != "traces.span.metrics":
        problems.append("span_metrics: namespace must be traces.span.metrics (names in rules)")
    dims = {d.get("name") for d in sm.get("dimensions") or []}
    for needed in (semconv.REQUEST_COLD_START, semconv.BATCH_SIZE):
        if needed not in dims:
            problems.append(f"span_metrics: dimension {needed!r} missing")
    excluded = set(sm.get("exclude_dimensions") or [])
    if excluded & {"span.name", "service.name"}:
        problems.append("span_metrics: span.name and service.name must stay dimensions")
    # Span metrics come from ALL spans: no sampling processor ahead of the connector.
    for pid, pipe in pipelines.items():
        if sm_id in (pipe.get("exporters") or []):
            samplers = [p for p in pipe.get("processors") or [] if "sampl" in _type(p)]
            if samplers:
                problems.append(f"pipeline {pid!r} samples ({samplers}) before {sm_id!r}")
    # Tail sampling keeps errors, slow requests, cold starts and a share of the rest.
    tails = [
        p for pipe in pipelines.values() for p in pipe.get("processors") or []
        if _type(p) == "tail_sampling"
    ]
    if not tails:
        problems.append("no traces pipeline uses tail_sampling")
    for tid in tails:
        policies = {p["type"]: p for p in cfg["processors"][tid]["policies"]}
        if "ERROR" not in (policies.get("status_code", {}).get("status_code") or {}).get(
            "status_codes", []
        ):
            problems.append(f"{tid}: no policy keeps error traces")
        if "latency" not in policies:
            problems.append(f"{tid}: no policy keeps slow requests")
        cold = policies.get("boolean_attribute", {}).get("boolean_attribute") or {}
        if cold.get("key") != semconv.REQUEST_COLD_START or cold.get("value") is not True:
            problems.append(f"{tid}: no policy keeps cold starts")
        if "probabilistic" not in policies:
            problems.append(f"{tid}: no probabilistic share of the rest")
    grpc = cfg["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    http = cfg["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    health = cfg["extensions"]["health_check"]["endpoint"]
    for what, endpoint, port in (("grpc", grpc, "4317"), ("http", http, "4318"),
                                 ("health_check", health, "13133")):
        if not endpoint.rstrip("}").endswith(f":{port}"):
            problems.append(f"{what} endpoint {endpoint!r} should default to port {port}")
    return problems


def merge_configs(base: Any, overlay: Any) -> Any:
    """The collector's --config merge: maps merge recursively, anything else is replaced."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = dict(base)
        for key, value in overlay.items():
            merged[key] = merge_configs(base[key], value) if key in base else value
        return merged
    return copy.deepcopy(overlay)


@pytest.fixture()
def bundled() -> dict[str, Any]:
    return yaml.safe_load(BUNDLED.read_text(encoding="utf-8"))


def test_bundled_config_is_shipped_and_identical_everywhere() -> None:
    text = collector_config_text()
    assert text == BUNDLED.read_text(encoding="utf-8")
    assert REPO_COPY.read_bytes() == BUNDLED.read_bytes(), (
        "collector_config/otel-stages.yaml differs from otel_stages/data/collector.yaml: "
        "edit the latter and copy it over"
    )
    configmap = next(yaml.safe_load_all((DEPLOY / "k8s" / "collector.yaml").read_text()))
    assert configmap["kind"] == "ConfigMap"
    assert configmap["data"]["collector.yaml"] == text, "deploy/k8s ConfigMap is stale"


def test_bundled_config_passes_structural_checks(bundled: dict[str, Any]) -> None:
    assert check_collector_config(bundled) == []
    assert check_otel_stages_contract(bundled) == []


def test_compose_overlay_merges_into_a_valid_config(bundled: dict[str, Any]) -> None:
    merged = merge_configs(bundled, yaml.safe_load(OVERLAY.read_text()))
    assert check_collector_config(merged) == []
    assert check_otel_stages_contract(merged) == []
    sampled = merged["service"]["pipelines"]["traces/sampled"]
    assert sampled["exporters"] == ["otlp_grpc/traces", "otlp_grpc/tempo"]
    assert sampled["processors"] == ["memory_limiter", "tail_sampling", "batch"]


#: Settings of the contrib `clickhouse` exporter (exporter/clickhouseexporter config.go and
#: README.md, otelcol-contrib 0.157.0): a key outside this set fails the collector at start.
CLICKHOUSE_EXPORTER_KEYS = {
    "endpoint", "username", "password", "database", "connection_params", "logs_table_name",
    "traces_table_name", "metrics_tables", "ttl", "table_engine", "cluster_name", "create_schema",
    "async_insert", "compress", "timeout", "sending_queue", "retry_on_failure", "tls", "json",
}


def test_clickhouse_overlay_adds_unsampled_pipelines(bundled: dict[str, Any]) -> None:
    merged = merge_configs(merge_configs(bundled, yaml.safe_load(OVERLAY.read_text())),
                           yaml.safe_load(CLICKHOUSE_OVERLAY.read_text()))
    assert check_collector_config(merged) == []
    assert check_otel_stages_contract(merged) == []
    pipelines = merged["service"]["pipelines"]
    for name in ("traces/clickhouse", "metrics/clickhouse"):
        # every span and GPU point: no tail sampling in front of the report's distributions
        assert pipelines[name] == {"receivers": ["otlp"], "processors": ["memory_limiter"],
                                   "exporters": ["clickhouse"]}
    exporter = merged["exporters"]["clickhouse"]
    assert set(exporter) <= CLICKHOUSE_EXPORTER_KEYS
    assert exporter["create_schema"] is True and "batch" in exporter["sending_queue"]
    # the tables the report reads by default are the exporter's default names
    assert "traces_table_name" not in exporter and "metrics_tables" not in exporter
    assert pipelines["traces/sampled"]["exporters"] == ["otlp_grpc/traces", "otlp_grpc/tempo"]


def test_clickhouse_profile_merges_into_the_stack(compose_cmd: list[str]) -> None:
    result = _run([*compose_cmd, "-f", str(COMPOSE), "-f", str(CLICKHOUSE_COMPOSE), "config"],
                  cwd=DEPLOY)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(io.StringIO(result.stdout))["services"]
    assert set(services) == {"collector", "jaeger", "tempo", "prometheus", "grafana", "clickhouse"}
    assert services["clickhouse"]["image"] == "clickhouse/clickhouse-server:26.9"
    assert 8123 in {int(p["published"]) for p in services["clickhouse"]["ports"]}
    command = services["collector"]["command"]
    assert command == ["--config=/etc/otel-stages/collector.yaml",
                       "--config=/etc/otel-stages/compose-overlay.yaml",
                       "--config=/etc/otel-stages/clickhouse-overlay.yaml"]
    mounts = {v["target"] if isinstance(v, dict) else v.split(":")[1]: v
              for v in services["collector"]["volumes"]}
    for target in ("/etc/otel-stages/collector.yaml", "/etc/otel-stages/compose-overlay.yaml",
                   "/etc/otel-stages/clickhouse-overlay.yaml"):
        source = mounts[target]["source"] if isinstance(mounts[target], dict) else mounts[target].split(":")[0]
        assert Path(source).is_file(), f"{target}: missing bind-mount source {source}"


def _mutate(cfg: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Copy of ``cfg`` with the dotted ``path`` set to ``value``."""
    cfg = copy.deepcopy(cfg)
    *parents, last = path.split(".")
    node = cfg
    for key in parents:
        node = node[key]
    node[last] = value
    return cfg


P = "service.pipelines"
ENDPOINT = "exporters.otlp_grpc/traces.endpoint"


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (f"{P}.metrics.exporters", ["otlp_http/metricz"],
         "exporter 'otlp_http/metricz' is not defined"),
        (f"{P}.metrics.processors", ["batch", "memory_limiter"],
         "memory_limiter must be the first"),
        (f"{P}.metrics.processors", ["memory_limiter", "batch", "tail_sampling"],
         "batch must be the last"),
        (f"{P}.metrics.receivers", ["otlp"],
         "must be an exporter in one pipeline and a receiver"),
        (f"{P}.logs", {"receivers": ["span_metrics"], "processors": ["memory_limiter"],
                       "exporters": ["otlp_http/metrics"]},
         "supports traces -> metrics"),
        ("service.extensions", ["health_check", "zpages"], "'zpages' is not defined"),
        (ENDPOINT, "${OTEL_STAGES_TRACES_ENDPOINT}", "malformed env placeholder"),
        (ENDPOINT, "$OTEL_STAGES_TRACES_ENDPOINT", "malformed env placeholder"),
        (ENDPOINT, "${env:OTEL_X:jaeger:4317}", "malformed env placeholder"),
        ("exporters.debug", {}, "'debug' is defined but not used"),
        ("processors.tailsampling", {}, "unknown type 'tailsampling'"),
        # A valid variation must not be flagged: span metrics plus a second traces exporter.
        (f"{P}.traces/spanmetrics.exporters", ["span_metrics", "otlp_grpc/traces"], None),
    ],
)
def test_structural_checker_reports_broken_pipelines(
    bundled: dict[str, Any], path: str, value: Any, expected: str | None
) -> None:
    broken = _mutate(bundled, path, value)
    problems = check_collector_config(broken)
    if expected is None:
        assert problems == []
    else:
        assert any(expected in p for p in problems), problems


def test_structural_checker_names_deprecated_aliases(bundled: dict[str, Any]) -> None:
    text = BUNDLED.read_text(encoding="utf-8")
    old = text.replace("span_metrics", "spanmetrics").replace("otlp_grpc/", "otlp/")
    problems = check_collector_config(yaml.safe_load(old))
    assert any("'spanmetrics' is a deprecated alias" in p and "'span_metrics'" in p
               for p in problems)
    assert any("'otlp' is a deprecated alias" in p and "'otlp_grpc'" in p for p in problems)


def _span_metrics(cfg: dict[str, Any]) -> dict[str, Any]:
    return cfg["connectors"]["span_metrics"]


def _policies(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return cfg["processors"]["tail_sampling"]["policies"]


@pytest.mark.parametrize(
    ("mutation", "expected"),
    [
        (lambda c: _span_metrics(c)["histogram"].pop("unit"), "unit must be pinned"),
        (lambda c: _span_metrics(c)["exemplars"].update(enabled=False), "exemplars"),
        (lambda c: _span_metrics(c)["dimensions"].pop(0), "request.cold_start"),
        (lambda c: c["service"]["pipelines"]["traces/spanmetrics"]["processors"].insert(
            1, "tail_sampling"), "samples (['tail_sampling']) before"),
        (lambda c: _policies(c).pop(2), "no policy keeps cold starts"),
        (lambda c: _policies(c).pop(0), "no policy keeps error"),
    ],
)
def test_contract_checker_reports_missing_behaviour(
    bundled: dict[str, Any], mutation: Any, expected: str
) -> None:
    broken = copy.deepcopy(bundled)
    mutation(broken)
    assert any(expected in p for p in check_otel_stages_contract(broken))


def test_collector_config_command_prints_and_writes(tmp_path: Path, capsys: Any) -> None:
    from otel_stages import cli
    from otel_stages.commands import collector_config as command

    assert cli.COMMANDS["collector-config"][0] == "otel_stages.commands.collector_config"
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    assert command.run(parser.parse_args([])) == 0
    assert capsys.readouterr().out == collector_config_text()
    out = tmp_path / "otelcol.yaml"
    assert command.run(parser.parse_args(["-o", str(out)])) == 0
    assert out.read_text(encoding="utf-8") == collector_config_text()
    assert command.run(parser.parse_args(["-o", str(tmp_path / "missing" / "x.yaml")])) == 1


# --------------------------------------------------------------------------------------------
# Names: what the dashboard and rules query is what the pipeline produces
# --------------------------------------------------------------------------------------------

_PROM_UNITS = {"ms": "milliseconds", "s": "seconds", "By": "bytes", "W": "watts", "Cel": "celsius"}


def prometheus_name(otel_name: str, unit: str, kind: str) -> str:
    """Prometheus' OTLP translation (UnderscoreEscapingWithSuffixes) for the cases used here."""
    name = otel_name.replace(".", "_")
    if unit == "1":
        return f"{name}_ratio" if kind == "gauge" else name
    name = f"{name}_{_PROM_UNITS[unit]}"
    return f"{name}_total" if kind == "counter" else name


def expected_metric_names(cfg: dict[str, Any]) -> set[str]:
    sm = cfg["connectors"]["span_metrics"]
    duration = prometheus_name(f"{sm['namespace']}.duration", sm["histogram"]["unit"], "histogram")
    calls = sm["namespace"].replace(".", "_") + "_calls_total"
    gpu = {
        prometheus_name(semconv.HW_GPU_UTILIZATION, semconv.UNIT_RATIO, "gauge"),
        prometheus_name(semconv.HW_GPU_MEMORY_USAGE, semconv.UNIT_BYTES, "gauge"),
        prometheus_name(semconv.HW_GPU_MEMORY_LIMIT, semconv.UNIT_BYTES, "gauge"),
        prometheus_name(semconv.HW_POWER, semconv.UNIT_WATTS, "gauge"),
        prometheus_name(semconv.HW_TEMPERATURE, semconv.UNIT_CELSIUS, "gauge"),
    }
    return {f"{duration}_bucket", f"{duration}_sum", f"{duration}_count", calls} | gpu


def test_prometheus_names_match_the_translation_of_the_pipeline(bundled: dict[str, Any]) -> None:
    names = expected_metric_names(bundled)
    assert "traces_span_metrics_duration_milliseconds_bucket" in names
    assert "traces_span_metrics_calls_total" in names
    assert "hw_gpu_utilization_ratio" in names and "hw_gpu_memory_usage_bytes" in names


_SELECTOR = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{")
_RANGE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\[")  # metric[5m] without braces
_LABEL_VALUES = re.compile(r"label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*(\w+)\s*\)")


def dashboard_queries() -> list[str]:
    """Every PromQL expression in the dashboard and in the provisioned data sources."""
    exprs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    dashboard = json.loads(DASHBOARD.read_text())
    walk(dashboard["panels"])
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":  # label_values(metric, label): the metric part is PromQL
            match = _LABEL_VALUES.fullmatch(var["definition"])
            assert match, var["definition"]
            exprs.append(match.group(1))
    sources = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    for source in sources:
        for query in (source.get("jsonData", {}).get("tracesToMetrics") or {}).get("queries", []):
            exprs.append(query["query"].replace("$$", "$"))  # provisioning escapes $ as $$
    return exprs


# Grafana variables -> something PromQL accepts in the same position.
_GRAFANA_VARS = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "$service": ".*",
    "$stage": "download|decode|resize|queue|forward",
    "$__tags": 'service_name="vision"',
    "${__span.name}": "decode",
}


def substitute_grafana_vars(expr: str) -> str:
    for var in sorted(_GRAFANA_VARS, key=len, reverse=True):
        expr = expr.replace(var, _GRAFANA_VARS[var])
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}: add it to _GRAFANA_VARS"
    return expr


def promql_check(
    promtool: str, exprs: list[str], tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """Parse each expression with promtool, as the expr of a recording rule."""
    rules = {"groups": [{"name": "parse-only", "rules": [
        {"record": f"dashboard:expr_{i}", "expr": e} for i, e in enumerate(exprs)
    ]}]}
    path = tmp_path / "exprs.rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return _run([promtool, "check", "rules", str(path)])


def test_dashboard_queries_use_only_metrics_and_labels_the_pipeline_produces(
    bundled: dict[str, Any],
) -> None:
    names = expected_metric_names(bundled)
    exprs = dashboard_queries()
    assert len(exprs) >= 10
    used = {m for e in exprs for m in _SELECTOR.findall(e)} | {
        e for e in exprs if re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e)
    }
    assert used and used <= names, f"not produced by the pipeline: {sorted(used - names)}"
    dims = {d["name"].replace(".", "_") for d in _span_metrics(bundled)["dimensions"]}
    text = "\n".join(exprs)
    for label in ("request_cold_start", "batch_size"):
        assert label in text and label in dims


def test_every_dashboard_query_parses_with_promtool(promtool: str, tmp_path: Path) -> None:
    exprs = [substitute_grafana_vars(e) for e in dashboard_queries()]
    result = promql_check(promtool, exprs, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout


def test_promql_check_fails_on_a_broken_query(promtool: str, tmp_path: Path) -> None:
    exprs = [substitute_grafana_vars(e) for e in dashboard_queries()]
    exprs[1] = exprs[1].replace(")", "", 1)  # unbalanced parenthesis
    result = promql_check(promtool, exprs, tmp_path)
    assert result.returncode != 0
    assert "dashboard:expr_1" in result.stdout + result.stderr


def test_alert_rules_query_only_produced_metrics(bundled: dict[str, Any]) -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    exprs = "\n".join(r["expr"] for r in rules)
    # Recorded series read through a range (last_over_time(stage:...[20m])) are checked below.
    selectors = (set(_SELECTOR.findall(exprs)) | set(_RANGE.findall(exprs))) - recorded
    produced = expected_metric_names(bundled)
    assert selectors and selectors <= produced, sorted(selectors - produced)
    # Every recorded series an alert uses is recorded here.
    alerts = "\n".join(r["expr"] for r in rules if "alert" in r)
    referenced = set(re.findall(r"\bstage:[a-z0-9_:]+", alerts))
    assert referenced and referenced <= recorded, sorted(referenced - recorded)


# --------------------------------------------------------------------------------------------
# Alert rules: promtool check / test, and proof that the tests catch a broken rule
# --------------------------------------------------------------------------------------------

def test_promtool_check_rules(promtool: str) -> None:
    result = _run([promtool, "check", "rules", str(RULES)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_check_rules_rejects_a_broken_rule(promtool: str, tmp_path: Path) -> None:
    broken = tmp_path / "rules.yaml"
    text = RULES.read_text()
    assert text.count("        for: 30m\n") == 1
    broken.write_text(text.replace("        for: 30m\n", "        for: 30 minutes\n"))
    result = _run([promtool, "check", "rules", str(broken)])
    assert result.returncode != 0


def test_promtool_unit_tests_pass(promtool: str) -> None:
    result = _run([promtool, "test", "rules", str(RULES_TEST)], cwd=RULES_TEST.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def _run_one_test_group(
    promtool: str, tmp_path: Path, group_name: str, rules_text: str
) -> subprocess.CompletedProcess[str]:
    suite = yaml.safe_load(RULES_TEST.read_text())
    groups = [g for g in suite["tests"] if g["name"] == group_name]
    assert len(groups) == 1, f"no test group named {group_name!r}"
    suite["tests"] = groups
    (tmp_path / "rules.yaml").write_text(rules_text)
    (tmp_path / "rules_test.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    return _run([promtool, "test", "rules", "rules_test.yaml"], cwd=tmp_path)


_SPIKE = "drift stays quiet on a short spike and on a wobble"
_FLOORS = "drift stays quiet on a low-traffic stage and on a tiny stage"
_DAILY = "drift stays quiet when yesterday had the same slowdown"
_DRIFT = "drift fires after a sustained slowdown"
_ERRORS = "error ratio fires on a failing stage, under both status-code conventions"
_OTEL_ERRORS = (
    "            or\n"
    '              rate(traces_span_metrics_calls_total{otel_status_code="ERROR"}[5m])\n'
)


# Each clause of the alerts is load-bearing: removing it makes a named unit test fail.
@pytest.mark.parametrize(
    ("old", "new", "group"),
    [
        ("        for: 30m\n", "        for: 5m\n", _SPIKE),  # spikes would page
        ("> 20\n", "> 0\n", _FLOORS),  # tiny stage would page
        ("> 0.1\n", "> 0\n", _FLOORS),  # low-traffic stage would page
        ("> 1.5 * stage:span_duration_ms:p95_1h_offset_1d", "> 0", _DAILY),
        ("> 1.5 * last_over_time(stage:span_duration_ms:p95_7d[20m])",
         "> 10 * last_over_time(stage:span_duration_ms:p95_7d[20m])", _DRIFT),
        (_OTEL_ERRORS, "", _ERRORS),  # new status-code convention would go unnoticed
    ],
)
def test_unit_tests_fail_on_a_weakened_rule(
    promtool: str, tmp_path: Path, old: str, new: str, group: str
) -> None:
    original = RULES.read_text()
    assert original.count(old) == 1, f"mutation target not found once: {old!r}"
    # (the intact rules pass every group: test_promtool_unit_tests_pass)
    weakened = _run_one_test_group(promtool, tmp_path, group, original.replace(old, new))
    assert weakened.returncode != 0, f"{group!r} did not catch: {old!r} -> {new!r}"
    assert "FAILED" in weakened.stdout + weakened.stderr


# --------------------------------------------------------------------------------------------
# Compose file
# --------------------------------------------------------------------------------------------

def _compose_config(compose_cmd: list[str], path: Path) -> subprocess.CompletedProcess[str]:
    return _run([*compose_cmd, "-f", str(path), "config"], cwd=path.parent)


def test_compose_file_is_valid_and_complete(compose_cmd: list[str]) -> None:
    result = _compose_config(compose_cmd, COMPOSE)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(io.StringIO(result.stdout))["services"]
    assert set(services) == {"collector", "jaeger", "tempo", "prometheus", "grafana"}
    for name, svc in services.items():
        image = svc["image"]
        tag = image.rsplit(":", 1)[-1] if ":" in image.split("/")[-1] else ""
        assert tag and tag != "latest", f"{name}: image {image!r} is not pinned"
    assert services["collector"]["image"].endswith(f":{COLLECTOR_CONTRIB_VERSION}")
    published = {
        int(p["published"]) for svc in services.values() for p in svc.get("ports", [])
    }
    assert published >= {4317, 4318, 13133, 16686, 3200, 9090, 3000}
    for name, svc in services.items():  # bind mounts point at files that exist
        for vol in svc.get("volumes", []):
            source = vol["source"] if isinstance(vol, dict) else vol.split(":", 1)[0]
            if source.startswith("/"):
                assert Path(source).exists(), f"{name}: missing bind-mount source {source}"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("    image: prom/prometheus:v3.14.0", "    imag: prom/prometheus:v3.14.0"),  # unknown key
        ('      - "9090:9090"', '      - "nine:9090"'),  # bad port
        ("      - prometheus-data:/prometheus", "      - prometheus-dat:/prometheus"),  # undeclared
    ],
)
def test_compose_check_fails_on_a_broken_file(
    compose_cmd: list[str], tmp_path: Path, old: str, new: str
) -> None:
    text = COMPOSE.read_text()
    assert text.count(old) == 1
    broken = tmp_path / "compose.yaml"
    broken.write_text(text.replace(old, new))
    assert _compose_config(compose_cmd, broken).returncode != 0


# --------------------------------------------------------------------------------------------
# Kubernetes manifests
# --------------------------------------------------------------------------------------------

def _k8s(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / "k8s" / name).read_text()) if d]


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_k8s_collector_daemonset_is_reachable_per_node() -> None:
    daemonset = next(d for d in _k8s("collector.yaml") if d["kind"] == "DaemonSet")
    (container,) = daemonset["spec"]["template"]["spec"]["containers"]
    assert container["image"].endswith(f":{COLLECTOR_CONTRIB_VERSION}")
    host_ports = {p["containerPort"]: p.get("hostPort") for p in container["ports"]}
    assert host_ports[4317] == 4317 and host_ports[4318] == 4318
    assert container["livenessProbe"]["httpGet"]["port"] == "health"
    assert {"OTEL_STAGES_TRACES_ENDPOINT", "OTEL_STAGES_METRICS_ENDPOINT"} <= set(_env(container))
    assert container["resources"]["limits"]["memory"]  # memory_limiter percentages need a limit


def test_k8s_gpu_deployment_uses_standard_otel_env() -> None:
    (deployment,) = _k8s("inference-gpu.yaml")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = _env(container)
    names = [e["name"] for e in container["env"]]
    assert env["NODE_IP"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    assert env["K8S_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["K8S_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://$(NODE_IP):4317"
    assert env["OTEL_SERVICE_NAME"]
    attrs = dict(kv.split("=", 1) for kv in env["OTEL_RESOURCE_ATTRIBUTES"].split(","))
    assert attrs["k8s.node.name"] == "$(K8S_NODE_NAME)"
    assert attrs["k8s.pod.name"] == "$(K8S_POD_NAME)"
    # $(VAR) only expands for variables defined earlier in the list.
    for var in ("NODE_IP", "K8S_NODE_NAME", "K8S_POD_NAME"):
        assert names.index(var) < names.index("OTEL_RESOURCE_ATTRIBUTES")
    assert names.index("NODE_IP") < names.index("OTEL_EXPORTER_OTLP_ENDPOINT")
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"]


# --------------------------------------------------------------------------------------------
# deploy/drift_demo.py: backfilled history + live traffic that trips the drift alert
# --------------------------------------------------------------------------------------------

def _drift_demo() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("drift_demo", DEPLOY / "drift_demo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _p95_from_buckets(cumulative: dict[float, float]) -> float:
    """histogram_quantile(0.95, ...) for one set of cumulative buckets (linear interpolation)."""
    bounds = sorted(cumulative)
    total = cumulative[bounds[-1]]
    rank, prev_bound, prev_count = 0.95 * total, 0.0, 0.0
    for bound in bounds:
        if cumulative[bound] >= rank:
            share = (rank - prev_count) / (cumulative[bound] - prev_count)
            return prev_bound + (bound - prev_bound) * share
        prev_bound, prev_count = bound, cumulative[bound]
    raise AssertionError("rank beyond the last bucket")


def test_drift_demo_history_backfills_with_promtool(promtool: str, tmp_path: Path) -> None:
    demo = _drift_demo()
    history = tmp_path / "history.om"
    with history.open("w") as out:
        demo.write_history(out, days=0.5, end_s=1_700_000_000)
    blocks = tmp_path / "blocks"
    result = _run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(history), str(blocks)]
    )
    assert result.returncode == 0, result.stdout + result.stderr
    listing = _run([promtool, "tsdb", "list", str(blocks)])
    assert listing.returncode == 0 and len(listing.stdout.splitlines()) > 1, listing.stdout


def test_drift_demo_traffic_trips_the_alert_thresholds() -> None:
    demo = _drift_demo()
    end = 1_700_000_000
    last: dict[float, float] = {}
    for line in demo.history_lines(end_s=end, days=0.1):
        if 'span_name="decode"' in line and "_bucket" in line and line.endswith(f" {end}"):
            le = re.search(r'le="([^"]+)"', line).group(1)
            last[float("inf") if le == "+Inf" else float(le)] = float(line.split()[-2])
    baseline = _p95_from_buckets({b: c for b, c in last.items() if b != float("inf")})
    rng = random.Random(7)
    slow = sorted(demo.request_durations_ms("decode", 6.0, rng)["decode"] for _ in range(2000))
    live_p95 = slow[int(0.95 * len(slow))]
    rules = RULES.read_text()
    assert "> 1.5 * last_over_time(stage:span_duration_ms:p95_7d[20m])" in rules and "> 20\n" in rules
    assert live_p95 > 1.5 * baseline and live_p95 - baseline > 20, (baseline, live_p95)


def test_drift_demo_emits_a_request_with_stage_children() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    demo = _drift_demo()
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    durations = {stage: 10.0 * (i + 1) for i, stage in enumerate(demo.STAGE_MEAN_MS)}
    demo.emit_request(provider.get_tracer("t"), durations, seq=3, end_ns=10**18)
    spans = {s.name: s for s in exporter.get_finished_spans()}
    request = spans.pop(semconv.SPAN_REQUEST)
    assert list(spans) == list(semconv.STANDARD_STAGES)
    assert request.attributes[semconv.REQUEST_SEQ] == 3
    assert request.end_time == 10**18
    assert request.end_time - request.start_time == int(sum(durations.values()) * 1e6)
    for name, span in spans.items():
        assert span.parent.span_id == request.context.span_id
        assert span.end_time - span.start_time == pytest.approx(durations[name] * 1e6, abs=2)


def _duration_s(text: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    return float(text[:-1]) * units[text[-1]]


def test_slow_recording_rules_are_read_through_last_over_time() -> None:
    # Prometheus finds an instant sample only within its 5-minute lookback delta: a series
    # recorded every 15 minutes read with a plain selector is missing 10 minutes in 15, which
    # resets any `for:` clause. promtool test rules cannot see this (it evaluates every group at
    # the test's step), so check it here.
    groups = yaml.safe_load(RULES.read_text())["groups"]
    slow = {r["record"]: _duration_s(g["interval"]) for g in groups
            if _duration_s(g.get("interval", "1m")) > 5 * 60 for r in g["rules"] if "record" in r}
    assert slow, "expected the 7-day baseline group to be evaluated slowly"
    for g in groups:
        for rule in g["rules"]:
            for name in slow:
                expr = rule["expr"]
                bare = re.findall(rf"(?<![\w:(]){re.escape(name)}(?![\w:\[])", expr)
                assert not bare, f"{rule.get('alert') or rule.get('record')} reads {name} without last_over_time"
                for window in re.findall(rf"last_over_time\(\s*{re.escape(name)}\[(\w+)\]\)", expr):
                    assert _duration_s(window) > slow[name], f"{name}: window {window} within its interval"


# --------------------------------------------------------------------------------------------
# Deploy corrections checked against the pinned upstream versions (issue 8)
# --------------------------------------------------------------------------------------------


def _go_format_float(x: float) -> str:
    """Go's strconv.FormatFloat(x, 'f', -1, 64), which Prometheus' OTLP translation uses for
    ``le`` (storage/remote/otlptranslator/prometheusremotewrite/histograms.go)."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def _connector_bounds_ms(cfg: dict[str, Any]) -> list[float]:
    """The span_metrics connector's explicit buckets in the histogram unit (ms)."""
    sm = _span_metrics(cfg)
    assert sm["histogram"]["unit"] == "ms"
    out = []
    for raw in sm["histogram"]["explicit"]["buckets"]:
        match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s)", str(raw))
        assert match, raw
        out.append(float(match.group(1)) * (1000 if match.group(2) == "s" else 1))
    return out


def test_rules_test_uses_only_bucket_bounds_the_connector_emits(bundled: dict[str, Any]) -> None:
    emitted = {_go_format_float(b) for b in _connector_bounds_ms(bundled)} | {"+Inf"}
    used = set(re.findall(r'le="([^"]+)"', RULES_TEST.read_text()))
    assert used, "no bucket series in rules_test.yaml?"
    assert used <= emitted, f"bounds the connector never emits: {sorted(used - emitted)}"
    assert {"20", "50", "100", "200", "+Inf"} <= used


#: Keys of Prometheus v3.14.0's config (config/config.go yaml tags of Config, OTLPConfig,
#: StorageConfig/TSDBConfig, GlobalConfig) and its OTLP translation strategies. Prometheus parses
#: the file strictly: an unknown key is a startup error.
PROMETHEUS_VERSION = "v3.14.0"
PROMETHEUS_TOP_KEYS = {"global", "runtime", "alerting", "rule_files", "scrape_config_files",
                       "scrape_configs", "storage", "tracing", "remote_write", "remote_read", "otlp"}
PROMETHEUS_OTLP_KEYS = {"promote_all_resource_attributes", "promote_resource_attributes",
                        "ignore_resource_attributes", "translation_strategy",
                        "keep_identifying_resource_attributes", "convert_histograms_to_nhcb",
                        "promote_scope_metadata", "label_name_underscore_sanitization",
                        "label_name_preserve_multiple_underscores"}
PROMETHEUS_STORAGE_KEYS = {"tsdb", "exemplars"}
PROMETHEUS_TSDB_KEYS = {"out_of_order_time_window", "stale_series_compaction_threshold",
                        "chunk_encoding", "retention"}
PROMETHEUS_GLOBAL_KEYS = {"scrape_interval", "scrape_timeout", "scrape_protocols",
                          "evaluation_interval", "rule_query_offset", "query_log_file",
                          "scrape_failure_log_file", "external_labels", "body_size_limit",
                          "sample_limit", "target_limit", "label_limit", "label_name_length_limit",
                          "label_value_length_limit", "keep_dropped_targets",
                          "metric_name_validation_scheme", "metric_name_escaping_scheme",
                          "scrape_native_histograms", "convert_classic_histograms_to_nhcb",
                          "always_scrape_classic_histograms", "extra_scrape_metrics"}
TRANSLATION_STRATEGIES = {"UnderscoreEscapingWithSuffixes", "UnderscoreEscapingWithoutSuffixes",
                          "NoUTF8EscapingWithSuffixes", "NoTranslation"}
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"


def test_prometheus_yml_keys_are_those_of_the_pinned_prometheus() -> None:
    assert f"image: prom/prometheus:{PROMETHEUS_VERSION}" in COMPOSE.read_text()
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text())
    assert set(cfg) <= PROMETHEUS_TOP_KEYS, set(cfg) - PROMETHEUS_TOP_KEYS
    assert set(cfg["global"]) <= PROMETHEUS_GLOBAL_KEYS
    assert set(cfg["otlp"]) <= PROMETHEUS_OTLP_KEYS, set(cfg["otlp"]) - PROMETHEUS_OTLP_KEYS
    assert cfg["otlp"]["translation_strategy"] in TRANSLATION_STRATEGIES
    # the names the report, rules and dashboard read follow from this strategy
    assert cfg["otlp"]["translation_strategy"] == "UnderscoreEscapingWithSuffixes"
    assert set(cfg["storage"]) <= PROMETHEUS_STORAGE_KEYS
    assert set(cfg["storage"]["tsdb"]) <= PROMETHEUS_TSDB_KEYS
    for job in cfg["scrape_configs"]:
        assert {"job_name", "static_configs"} >= set(job)


def test_prometheus_key_check_catches_a_2x_only_or_misspelled_key(tmp_path: Path) -> None:
    cfg = yaml.safe_load(PROMETHEUS_YML.read_text())
    cfg["otlp"]["translation_stratgy"] = cfg["otlp"].pop("translation_strategy")
    assert not set(cfg["otlp"]) <= PROMETHEUS_OTLP_KEYS


def test_readme_does_not_promise_prometheus_2_with_this_prometheus_yml() -> None:
    text = (ROOT / "collector_config" / "README.md").read_text()
    assert "2.47+ with" not in text
    assert "translation_strategy" in text and "3.0" in text


def test_compose_collector_has_a_memory_limit_and_keeps_every_trace() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    collector = compose["services"]["collector"]
    assert collector.get("mem_limit"), "memory_limiter's percentages need a container memory limit"
    assert collector["environment"]["OTEL_STAGES_SAMPLE_PERCENT"] == "100"
    tempo = compose["services"]["tempo"]["image"]
    assert tempo == "grafana/tempo:2.9.5"
    assert "ingester:" in (DEPLOY / "tempo" / "tempo.yaml").read_text()  # hence the 3.x warning
    assert "rejects the\n    # `ingester:` and `compactor:`" in COMPOSE.read_text()


def _gpu_job_regexes() -> list[str]:
    out = []
    for expr in dashboard_queries():
        if "hw_gpu" in expr:
            match = re.search(r'job=~"([^"]+)"', expr)
            assert match, f"GPU query without a job filter: {expr}"
            out.append(match.group(1))
    return out


@pytest.mark.parametrize("job", ["vlm-server", "inference/vlm-server"])
def test_dashboard_gpu_panels_match_namespaced_jobs(job: str) -> None:
    """Prometheus' OTLP receiver sets job to service.name, or service.namespace/service.name."""
    regexes = _gpu_job_regexes()
    assert len(regexes) >= 3
    for regex in regexes:
        one = regex.replace("$service", "vlm-server")  # one service selected
        many = regex.replace("$service", "(api|vlm-server)")  # multi-value: Grafana's (a|b)
        every = regex.replace("$service", ".*")  # All: allValue
        for r in (one, many, every):
            assert re.fullmatch(r, job), (r, job)  # Prometheus anchors regex matchers
        assert not re.fullmatch(one, "other/vlm-server-2")
