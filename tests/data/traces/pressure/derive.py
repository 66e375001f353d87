"""Derive the two synthetic files of README.md from ``bigio.otlp.jsonl`` (same spans):

* ``bigio_no_pressure.otlp.jsonl``: without the ``system.cpu.linux.pressure.total`` metric (a
  producer without PSI, an old file);
* ``bigio_high_pressure.otlp.jsonl``: its pressure replaced by a counter that rises during each
  decode span by 90 % of the span's waiting (wall - thread CPU time), as if the cores had been
  busy all the while; without ``otel_stages.pressure.scope`` (read as host-wide pressure,
  which cannot confirm a wait for a core).

Usage: python derive.py (in this folder)."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
NAME = "system.cpu.linux.pressure.total"


def main() -> None:
    lines = (HERE / "bigio.otlp.jsonl").read_text().splitlines()
    docs = [json.loads(line) for line in lines]
    plain = []
    windows = []
    template = None
    for doc in docs:
        for rs in doc.get("resourceSpans", []):
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    if span["name"] != "decode":
                        continue
                    attrs = {a["key"]: a["value"] for a in span["attributes"]}
                    cpu = float(attrs["thread.cpu_time_ms"]["doubleValue"])
                    start, end = int(span["startTimeUnixNano"]), int(span["endTimeUnixNano"])
                    windows.append((start, end, max(0.0, (end - start) / 1e6 - cpu)))
        for rm in doc.get("resourceMetrics", []):
            for sm in rm["scopeMetrics"]:
                kept = []
                for m in sm["metrics"]:
                    if m["name"] == NAME:
                        template = template or (rm["resource"], m)
                    else:
                        kept.append(m)
                sm["metrics"] = kept
        plain.append(doc)
    assert template is not None and windows
    (HERE / "bigio_no_pressure.otlp.jsonl").write_text(
        "\n".join(json.dumps(d, separators=(",", ":")) for d in plain) + "\n")
    resource, metric = template
    first = metric["sum"]["dataPoints"][0]
    points, total_s = [], 100.0
    for start, end, wait_ms in sorted(windows):
        points.append((start, total_s))
        total_s += 0.9 * wait_ms / 1e3
        points.append((end, total_s))
    # no otel_stages.pressure.scope: a synthetic series, as an older file has (read as host)
    unscoped = [a for a in first["attributes"] if a["key"] != "otel_stages.pressure.scope"]
    high = dict(metric)
    high["sum"] = dict(metric["sum"], dataPoints=[
        {"attributes": unscoped, "startTimeUnixNano": first["startTimeUnixNano"],
         "timeUnixNano": str(t), "asDouble": v} for t, v in points])
    extra = {"resourceMetrics": [{"resource": resource,
                                  "scopeMetrics": [{"scope": {"name": "derive.py"}, "metrics": [high]}]}]}
    (HERE / "bigio_high_pressure.otlp.jsonl").write_text(
        "\n".join(json.dumps(d, separators=(",", ":")) for d in [*plain, extra]) + "\n")


if __name__ == "__main__":
    main()
