"""Derive the ``*_no_runq`` files of README.md from the recordings (same spans and points):
``otel_stages.thread.run_queue_wait_ms`` taken off every span (a producer without
``configure(run_queue=True)``) and every CPU pressure point marked ``otel_stages.pressure.scope``
= ``host`` (what they were: the recording machine's process sat in the root cgroup).

Usage: python derive.py (in this folder)."""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).parent
RUN_QUEUE = "otel_stages.thread.run_queue_wait_ms"
PRESSURE = "system.cpu.linux.pressure.total"
SCOPE = "otel_stages.pressure.scope"


def derive(name: str) -> None:
    out = []
    for line in (HERE / f"{name}.otlp.jsonl").read_text().splitlines():
        doc = json.loads(line)
        for rs in doc.get("resourceSpans", []):
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    span["attributes"] = [a for a in span.get("attributes", [])
                                          if a["key"] != RUN_QUEUE]
        for rm in doc.get("resourceMetrics", []):
            for sm in rm["scopeMetrics"]:
                for metric in sm["metrics"]:
                    if metric["name"] != PRESSURE:
                        continue
                    for point in metric["sum"]["dataPoints"]:
                        point["attributes"] = [a for a in point.get("attributes", [])
                                               if a["key"] != SCOPE]
                        point["attributes"].append({"key": SCOPE, "value": {"stringValue": "host"}})
        out.append(json.dumps(doc, separators=(",", ":")))
    (HERE / f"{name}_no_runq.otlp.jsonl").write_text("\n".join(out) + "\n")


def main() -> None:
    for name in ("idle_loops", "hash_threads"):
        derive(name)


if __name__ == "__main__":
    main()
