"""Run one GPU scenario in a fresh process (so ``LD_LIBRARY_PATH`` picks the fake NVML library)
and print one JSON object with what came out.

``python scenario.py '<json spec>'`` with spec keys:

- ``data_dir``: where configure() writes its OTLP/JSON files;
- ``configure``: extra keyword arguments for ``otel_stages.configure``;
- ``forward_s``: how long the one ``forward`` stage lasts (the workload; the fake GPU's busy/idle
  pattern runs on its own clock);
- ``wait_ready``: wait for NVML init before the request (default true);
- ``init_timeout_s``: instead of configure(), open a bare Sampler with this init timeout;
- ``fork``: fork after configure(); the child runs the request and reports instead.
- ``requests``: run this many requests instead of one (default 1); with ``slow_forward_s`` and
  ``pressure_period_ms`` a forward that starts in a pressure phase of the library's
  ``memory_pressure`` scenario (same clock, same period) lasts ``slow_forward_s``.

Output keys: ``configure_s``, ``request_s``, ``flush_s``, ``stats`` (sampler), ``forward``
(span start/end ns and attributes), ``points`` (metric name -> list of {t, v, attrs}),
``logs`` (records at INFO and above), ``window_ns`` (span clock before configure / after
flush), ``configuration_error``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

RECORDS: list[dict[str, str]] = []


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        RECORDS.append({"level": record.levelname, "logger": record.name, "message": record.getMessage()})


def _value(v: dict) -> object:
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    return int(v["intValue"]) if "intValue" in v else v


def _attrs(raw: list[dict]) -> dict:
    return {a["key"]: _value(a["value"]) for a in raw}


def read_files(folder: Path) -> tuple[dict | None, dict[str, list[dict]]]:
    """(forward span, metric points) from the OTLP/JSON lines files in ``folder``."""
    forward = None
    points: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("traces-*.jsonl")):
        for line in path.read_text().splitlines():
            for rs in json.loads(line)["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        if span["name"] == "forward":
                            forward = {"start_ns": int(span["startTimeUnixNano"]),
                                       "end_ns": int(span["endTimeUnixNano"]),
                                       "attributes": _attrs(span.get("attributes", [])),
                                       "instance": _attrs(rs["resource"]["attributes"]).get(
                                           "service.instance.id")}
    for path in sorted(folder.glob("metrics-*.jsonl")):
        for line in path.read_text().splitlines():
            for rm in json.loads(line)["resourceMetrics"]:
                for sm in rm["scopeMetrics"]:
                    for metric in sm["metrics"]:
                        for dp in metric.get("gauge", {}).get("dataPoints", []):
                            value = dp["asDouble"] if "asDouble" in dp else int(dp["asInt"])
                            points.setdefault(metric["name"], []).append(
                                {"t": int(dp["timeUnixNano"]), "v": value, "attrs": _attrs(dp["attributes"]),
                                 "instance": _attrs(rm["resource"]["attributes"]).get("service.instance.id")})
    return forward, points


def _bare_sampler(spec: dict) -> dict:
    from otel_stages.gpu.nvml import NvmlBackend
    from otel_stages.gpu.sampler import Sampler

    sampler = Sampler(NvmlBackend(), init_timeout_s=spec["init_timeout_s"])
    t0 = time.perf_counter()
    ok = sampler.open()
    return {"open_ok": ok, "open_s": time.perf_counter() - t0, "stats": sampler.stats()}


def _forward_s(spec: dict) -> float:
    """``slow_forward_s`` in a pressure phase of the fake library's ``memory_pressure`` scenario
    (the first of each pair of ``pressure_period_ms`` phases on the Unix clock), else
    ``forward_s``."""
    period_us = int(spec.get("pressure_period_ms", 0)) * 1000
    if period_us and "slow_forward_s" in spec and time.time_ns() // 1000 % (2 * period_us) < period_us:
        return float(spec["slow_forward_s"])
    return float(spec.get("forward_s", 0.0))


def main() -> None:
    spec = json.loads(sys.argv[1])
    logging.getLogger().addHandler(_Collect(level=logging.INFO))
    logging.getLogger().setLevel(logging.INFO)
    out: dict = {}
    if "init_timeout_s" in spec:
        out.update(_bare_sampler(spec))
        out["logs"] = RECORDS
        print(json.dumps(out))
        return

    import otel_stages as ots
    import otel_stages.sdk  # before t0: configure_s times configure(), not the imports
    from otel_stages._runtime import RUNTIME
    from otel_stages.gpu import session

    data_dir = Path(spec["data_dir"])
    out["window_ns"] = [RUNTIME.clock.now_ns()]
    t0 = time.perf_counter()
    try:
        telemetry = ots.configure(data_dir=data_dir, set_global=False, **spec.get("configure", {}))
    except ots.ConfigurationError as exc:
        out["configuration_error"] = str(exc)
        out["configure_s"] = time.perf_counter() - t0
        out["logs"] = RECORDS
        print(json.dumps(out))
        return
    out["configure_s"] = time.perf_counter() - t0

    out["parent_instance"] = telemetry.tracer_provider.resource.attributes.get("service.instance.id")
    child = spec.get("fork") and os.fork() == 0
    if spec.get("fork") and not child:
        _pid, status = os.wait()
        telemetry.shutdown()
        print((data_dir / "child.json").read_text() if status == 0 else json.dumps({"child_status": status}))
        return

    current = session.current()
    if spec.get("wait_ready", True) and current is not None:
        current.sampler.wait_ready(10)
    t0 = time.perf_counter()
    for _ in range(spec.get("requests", 1)):
        with ots.request():
            with ots.stage("forward"):
                time.sleep(_forward_s(spec))
    out["request_s"] = time.perf_counter() - t0 - spec.get("forward_s", 0.0)
    t0 = time.perf_counter()
    telemetry.force_flush()
    out["flush_s"] = time.perf_counter() - t0
    out["stats"] = current.sampler.stats() if current is not None else None
    telemetry.shutdown()
    out["window_ns"].append(RUNTIME.clock.now_ns())
    out["forward"], out["points"] = read_files(data_dir)
    out["logs"] = RECORDS
    if child:
        (data_dir / "child.json").write_text(json.dumps(out))
        os._exit(0)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
