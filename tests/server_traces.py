"""Traces shaped exactly as NVIDIA Triton and vLLM write them, as OTLP/JSON lines the way the
Collector's file exporter stores what they sent (pdata JSON: hex ids, enum numbers, int64 as
strings).

Triton (triton-inference-server/server ``src/tracer.cc``; expectations in
``qa/L0_trace/opentelemetry_unittest.py``): scope ``triton-server`` (``kTritonTracer``), resource
``service.name=triton-inference-server`` (its default ``resource`` setting), every span kind
SERVER. Per request: ``InferRequest`` with events HTTP_RECV_START, HTTP_RECV_END (captured before
the span starts: evhtp's receive times), HTTP_SEND_START, HTTP_SEND_END; a child named after the
model with attributes ``triton.model_name`` (string), ``triton.model_version``,
``triton.trace_id``, ``triton.trace_parent_id`` (ints) and events REQUEST_START, QUEUE_START,
REQUEST_END; under it ``compute`` with COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START,
COMPUTE_END. An ensemble adds a model span per composing model under the ensemble's span (the
ensemble span has REQUEST_START, QUEUE_START, REQUEST_END and no compute span of its own).

A request cancelled or timed out in the queue, or answered from the response cache (core
``src/dynamic_batch_scheduler.cc`` ``DynamicBatchScheduler::Enqueue``: QUEUE_START, then the
cached response and the release), has a model span with REQUEST_START, QUEUE_START and
REQUEST_END and no ``compute`` span; Triton sets no span status either way.

vLLM V1 (vllm-project/vllm ``vllm/v1/engine/output_processor.py`` ``do_tracing``; names in
``vllm/tracing.py`` ``SpanAttributes``): scope ``vllm.llm_engine``, resource from the SDK defaults
(``service.name=unknown_service`` unless ``OTEL_SERVICE_NAME``), one ``llm_request`` span (kind
SERVER) per finished request from its arrival time, float-second latencies in
``gen_ai.latency.*`` (queue, prefill, decode, inference, time to first token, e2e) and token
counts in ``gen_ai.usage.*``.

vLLM V0 (``vllm/engine/llm_engine.py`` ``LLMEngine.create_trace_span``, times from
``vllm/sequence.py`` ``RequestMetrics``): the same span and scope, but only times since
``arrival_time`` (taken before the engine tokenizes: ``vllm/engine/async_llm_engine.py``
``add_request_async``): ``time_in_queue`` = first scheduled - arrival
(``SequenceGroup.maybe_set_first_scheduled_time``), ``time_to_first_token``, ``e2e``, and
``time_in_scheduler`` (summed scheduler time); ``time_in_model_forward`` / ``_execute`` only with
``--collect-detailed-traces``. No prefill or decode attribute.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

T0_NS = 1_790_000_000_000_000_000
MS = 1_000_000


def _attr(key: str, value: object) -> dict:
    if isinstance(value, bool):
        v: dict = {"boolValue": value}
    elif isinstance(value, int):
        v = {"intValue": str(value)}
    elif isinstance(value, float):
        v = {"doubleValue": value}
    else:
        v = {"stringValue": str(value)}
    return {"key": key, "value": v}


def _span(trace_id: str, span_id: str, parent: str | None, name: str, start: int, end: int,
          attributes: dict | None = None, events: list[tuple[str, int]] = ()) -> dict:
    span = {
        "traceId": trace_id,
        "spanId": span_id,
        "name": name,
        "kind": 2,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(end),
        "status": {},
    }
    if parent:
        span["parentSpanId"] = parent
    if attributes:
        span["attributes"] = [_attr(k, v) for k, v in attributes.items()]
    if events:
        span["events"] = [{"timeUnixNano": str(t), "name": n} for n, t in events]
    return span


def _export(resource: dict, scope: str, spans: list[dict]) -> str:
    return json.dumps(
        {"resourceSpans": [{
            "resource": {"attributes": [_attr(k, v) for k, v in resource.items()]},
            "scopeSpans": [{"scope": {"name": scope}, "spans": spans}],
        }]},
        separators=(",", ":"),
    )


TRITON_RESOURCE = {
    "service.name": "triton-inference-server",
    "telemetry.sdk.language": "cpp",
    "telemetry.sdk.name": "opentelemetry",
    "telemetry.sdk.version": "1.8.3",
}


def _ids(rng: random.Random) -> tuple[str, ...]:
    return (f"{rng.getrandbits(128):032x}", *(f"{rng.getrandbits(64):016x}" for _ in range(4)))


def triton_request(rng: random.Random, seq: int, start: int, *, queue_ms: float, infer_ms: float,
                   recv_ms: float = 0.4, model: str = "vit_encoder",
                   ensemble: str | None = None, computed: bool = True) -> tuple[list[dict], int]:
    """One request's spans and its end time. With ``ensemble`` the model runs as the ensemble's
    only step (ensemble span -> model span -> compute). Without ``computed`` the request leaves
    the queue after ``queue_ms`` without running the model (cancelled, timed out, or a response
    cache hit): no compute span, REQUEST_END then, and the response sent as usual."""
    trace_id, root_id, model_id, compute_id, ens_id = _ids(rng)
    t = start
    recv_start, recv_end = t, t + int(recv_ms * MS)
    t = recv_end + int(0.05 * MS)  # the trace (and InferRequest) starts after the receive
    root_start = t
    spans: list[dict] = []
    parent = root_id
    if ensemble:
        ens_start = t + int(0.02 * MS)
        ens_events = [("REQUEST_START", ens_start), ("QUEUE_START", ens_start + int(0.01 * MS))]
        t = ens_start + int(0.03 * MS)
        parent = ens_id
    req_start = t + int(0.02 * MS)
    queue_start = req_start + int(0.01 * MS)
    compute_start = queue_start + int(queue_ms * MS)
    input_end = compute_start + int(1.0 * MS)
    output_start = input_end + int(infer_ms * MS)
    compute_end = output_start + int(0.5 * MS)
    req_end = compute_end + int(0.05 * MS) if computed else compute_start
    attrs = {"triton.model_name": model, "triton.model_version": 1,
             "triton.trace_id": seq * 2 if ensemble else seq,
             "triton.trace_parent_id": seq * 2 - 1 if ensemble else 0}
    spans.append(_span(trace_id, model_id, parent, model, req_start, req_end, attrs,
                       [("REQUEST_START", req_start), ("QUEUE_START", queue_start),
                        ("REQUEST_END", req_end)]))
    if computed:
        spans.append(_span(trace_id, compute_id, model_id, "compute", compute_start, compute_end,
                           None, [("COMPUTE_START", compute_start), ("COMPUTE_INPUT_END", input_end),
                                  ("COMPUTE_OUTPUT_START", output_start),
                                  ("COMPUTE_END", compute_end)]))
    t = req_end
    if ensemble:
        ens_end = t + int(0.02 * MS)
        ens_attrs = {"triton.model_name": ensemble, "triton.model_version": 1,
                     "triton.trace_id": seq * 2 - 1, "triton.trace_parent_id": 0}
        spans.append(_span(trace_id, ens_id, root_id, ensemble, ens_start, ens_end, ens_attrs,
                           [*ens_events, ("REQUEST_END", ens_end)]))
        t = ens_end
    send_start = t + int(0.05 * MS)
    send_end = send_start + int(0.1 * MS)
    root_end = send_end + int(0.02 * MS)
    spans.insert(0, _span(trace_id, root_id, None, "InferRequest", root_start, root_end, None,
                          [("HTTP_RECV_START", recv_start), ("HTTP_RECV_END", recv_end),
                           ("HTTP_SEND_START", send_start), ("HTTP_SEND_END", send_end)]))
    return spans, root_end


def triton_queue_scenario(path: Path, *, ensemble: str | None = None, n: int = 31,
                          not_computed: frozenset[int] = frozenset()) -> Path:
    """Dynamic batching: the queue wait swings 2..120 ms while inference stays ~20 ms; the first
    request is cold (900 ms inference: model warm-up). The requests numbered (from 1) in
    ``not_computed`` leave the queue without running the model."""
    rng = random.Random(8)
    lines, t = [], T0_NS
    for seq in range(1, n + 1):
        queue = rng.choice([2.0, 3.0, 5.0, 60.0, 90.0, 120.0]) if seq > 1 else 1.0
        infer = 900.0 if seq == 1 else 20.0 + rng.uniform(-0.5, 0.5)
        spans, end = triton_request(rng, seq, t, queue_ms=queue, infer_ms=infer, ensemble=ensemble,
                                    computed=seq not in not_computed)
        lines.append(_export(TRITON_RESOURCE, "triton-server", spans))
        t = end + 50 * MS
    path.write_text("\n".join(lines) + "\n")
    return path


VLLM_RESOURCE = {
    "telemetry.sdk.language": "python",
    "telemetry.sdk.name": "opentelemetry",
    "telemetry.sdk.version": "1.27.0",
    "service.name": "unknown_service",
}


def vllm_request(rng: random.Random, start: int, *, preprocess_s: float, queue_s: float,
                 prefill_s: float, decode_s: float, completion_tokens: int) -> tuple[dict, int]:
    """One ``llm_request`` span as do_tracing builds it; returns it and its end time."""
    trace_id, span_id = f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}"
    tail_s = 0.0004  # last token -> output processing: the span ends when do_tracing runs
    e2e = preprocess_s + queue_s + prefill_s + decode_s + tail_s
    end = start + round(e2e * 1e9)
    attrs = {
        "gen_ai.latency.time_to_first_token": preprocess_s + queue_s + prefill_s,
        "gen_ai.latency.e2e": e2e,
        "gen_ai.latency.time_in_queue": queue_s,
        "gen_ai.usage.prompt_tokens": 1245,  # image tokens + prompt
        "gen_ai.usage.completion_tokens": completion_tokens,
        "gen_ai.latency.time_in_model_prefill": prefill_s,
        "gen_ai.latency.time_in_model_decode": decode_s,
        "gen_ai.latency.time_in_model_inference": prefill_s + decode_s,
        "gen_ai.request.id": f"chatcmpl-{rng.getrandbits(64):016x}",
        "gen_ai.response.finish_reasons": json.dumps(["stop"]),
        "gen_ai.request.max_tokens": 512,
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.top_p": 0.95,
        "gen_ai.request.n": 1,
    }
    return _span(trace_id, span_id, None, "llm_request", start, end, attrs), end


def vllm_decode_scenario(path: Path, n: int = 30) -> Path:
    """Output length varies 30..400 tokens: decode swings 0.3..4 s; queue, prefill and input
    processing stay small."""
    rng = random.Random(9)
    lines, t = [], T0_NS
    for _ in range(n):
        tokens = rng.choice([30, 40, 60, 250, 320, 400])
        span, end = vllm_request(rng, t, preprocess_s=0.012 + rng.uniform(0, 0.002),
                                 queue_s=0.003 + rng.uniform(0, 0.001), prefill_s=0.085,
                                 decode_s=tokens * 0.01, completion_tokens=tokens)
        lines.append(_export(VLLM_RESOURCE, "vllm.llm_engine", [span]))
        t = end + 100 * MS
    path.write_text("\n".join(lines) + "\n")
    return path


def vllm_v0_request(rng: random.Random, start: int, *, queue_s: float, prefill_s: float,
                    decode_s: float, completion_tokens: int,
                    detailed: bool = False) -> tuple[dict, int]:
    """One ``llm_request`` span as vLLM V0's ``create_trace_span`` builds it (attribute order
    as it sets them); returns it and its end time. ``queue_s`` runs from arrival (it holds the
    engine's tokenization and input processing) to the first scheduling. ``detailed``: the
    server ran with ``--collect-detailed-traces`` (forward time converted from ms to s by
    vLLM, execute time in s)."""
    trace_id, span_id = f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}"
    ttft = queue_s + prefill_s
    e2e = ttft + decode_s
    tail_s = 0.0003  # finished_time -> do_tracing after the step's output processing
    end = start + round((e2e + tail_s) * 1e9)
    attrs: dict = {
        "gen_ai.response.model": "llava-hf/llava-1.5-7b-hf",
        "gen_ai.request.id": f"chatcmpl-{rng.getrandbits(64):016x}",
        "gen_ai.request.temperature": 0.7,
        "gen_ai.request.top_p": 0.95,
        "gen_ai.request.max_tokens": 512,
        "gen_ai.request.n": 1,
        "gen_ai.usage.num_sequences": 1,
        "gen_ai.usage.prompt_tokens": 1245,
        "gen_ai.usage.completion_tokens": completion_tokens,
        "gen_ai.latency.time_in_queue": queue_s,
        "gen_ai.latency.time_to_first_token": ttft,
        "gen_ai.latency.e2e": e2e,
        "gen_ai.latency.time_in_scheduler": 0.00004 * (completion_tokens + 1),
    }
    if detailed:
        attrs["gen_ai.latency.time_in_model_forward"] = (prefill_s + decode_s) * 0.8
        attrs["gen_ai.latency.time_in_model_execute"] = (prefill_s + decode_s) * 0.9
    return _span(trace_id, span_id, None, "llm_request", start, end, attrs), end


def vllm_v0_queue_scenario(path: Path, n: int = 30) -> Path:
    """vLLM V0 under bursts: the wait for the scheduler swings 5..400 ms while prefill (85 ms)
    and decode (64 tokens, ~0.64 s) stay steady; every third request ran with detailed traces."""
    rng = random.Random(10)
    lines, t = [], T0_NS
    for i in range(n):
        span, end = vllm_v0_request(rng, t, queue_s=rng.choice([0.005, 0.008, 0.01, 0.25, 0.4]),
                                    prefill_s=0.085 + rng.uniform(0, 0.002),
                                    decode_s=0.64 + rng.uniform(0, 0.005), completion_tokens=64,
                                    detailed=i % 3 == 0)
        lines.append(_export(VLLM_RESOURCE, "vllm.llm_engine", [span]))
        t = end + 100 * MS
    path.write_text("\n".join(lines) + "\n")
    return path


def triton_ensemble_request(rng: random.Random, seq: int, start: int, *, ensemble: str,
                            steps: list[tuple[str, float, float]],
                            recv_ms: float = 0.4) -> tuple[list[dict], int]:
    """One request to an ensemble whose composing models run one after another (``steps``:
    ``(model, queue ms, execution ms)`` each), shaped as Triton's ``src/tracer.cc`` writes it:
    ``InferRequest`` -> the ensemble's model span (REQUEST_START, QUEUE_START, REQUEST_END; no
    compute span: ``TraceManager::Trace::StartSpan`` parents a trace with ``parent_id == 0`` on
    the root span) -> one model span per composing model (its trace's ``parent_id`` is the
    ensemble's trace id, so ``StartSpan`` parents it on the ensemble's span; attributes
    ``triton.model_name``, ``triton.model_version``, ``triton.trace_id``,
    ``triton.trace_parent_id``) -> its ``compute`` span (COMPUTE_START .. COMPUTE_END). Composing
    models get trace ids after the ensemble's, as the core assigns them per child request.
    docs/user_guide/trace.md: "For ensembles, every composing model produces model and compute
    spans in addition to one model span for the ensemble"; qa/L0_trace/opentelemetry_unittest.py
    ``_test_ensemble_trace`` checks that nesting."""
    trace_id = f"{rng.getrandbits(128):032x}"
    root_id, ens_id = (f"{rng.getrandbits(64):016x}" for _ in range(2))
    recv_start, recv_end = start, start + int(recv_ms * MS)
    root_start = recv_end + int(0.05 * MS)
    ens_start = root_start + int(0.02 * MS)
    ens_trace = seq * (len(steps) + 1)
    spans: list[dict] = []
    t = ens_start + int(0.03 * MS)
    for k, (model, queue_ms, infer_ms) in enumerate(steps):
        model_id, compute_id = (f"{rng.getrandbits(64):016x}" for _ in range(2))
        req_start = t + int(0.02 * MS)
        queue_start = req_start + int(0.01 * MS)
        compute_start = queue_start + int(queue_ms * MS)
        input_end = compute_start + int(0.3 * MS)
        output_start = input_end + int(infer_ms * MS)
        compute_end = output_start + int(0.2 * MS)
        req_end = compute_end + int(0.05 * MS)
        attrs = {"triton.model_name": model, "triton.model_version": 1,
                 "triton.trace_id": ens_trace + k + 1, "triton.trace_parent_id": ens_trace}
        spans.append(_span(trace_id, model_id, ens_id, model, req_start, req_end, attrs,
                           [("REQUEST_START", req_start), ("QUEUE_START", queue_start),
                            ("REQUEST_END", req_end)]))
        spans.append(_span(trace_id, compute_id, model_id, "compute", compute_start, compute_end,
                           None, [("COMPUTE_START", compute_start), ("COMPUTE_INPUT_END", input_end),
                                  ("COMPUTE_OUTPUT_START", output_start),
                                  ("COMPUTE_END", compute_end)]))
        t = req_end
    ens_end = t + int(0.02 * MS)
    ens_attrs = {"triton.model_name": ensemble, "triton.model_version": 1,
                 "triton.trace_id": ens_trace, "triton.trace_parent_id": 0}
    spans.insert(0, _span(trace_id, ens_id, root_id, ensemble, ens_start, ens_end, ens_attrs,
                          [("REQUEST_START", ens_start),
                           ("QUEUE_START", ens_start + int(0.01 * MS)), ("REQUEST_END", ens_end)]))
    send_start = ens_end + int(0.05 * MS)
    send_end = send_start + int(0.1 * MS)
    root_end = send_end + int(0.02 * MS)
    spans.insert(0, _span(trace_id, root_id, None, "InferRequest", root_start, root_end, None,
                          [("HTTP_RECV_START", recv_start), ("HTTP_RECV_END", recv_end),
                           ("HTTP_SEND_START", send_start), ("HTTP_SEND_END", send_end)]))
    return spans, root_end


def triton_preprocess_scenario(path: Path, *, preprocess: str = "preprocess", n: int = 31,
                               postprocess: str | None = None) -> Path:
    """An image ensemble (``image_pipeline``: ``preprocess`` -> ``resnet50``, optionally ->
    ``postprocess``): the preprocessing model's execution (image decode and resize in a Python
    backend) swings 4..60 ms with the image size while the network stays at ~20 ms and the
    queues at ~1 ms. The first request is cold (the network's warm-up)."""
    rng = random.Random(11)
    lines, t = [], T0_NS
    for seq in range(1, n + 1):
        pre = rng.choice([4.0, 6.0, 8.0, 35.0, 50.0, 60.0])
        net = 900.0 if seq == 1 else 20.0 + rng.uniform(-0.5, 0.5)
        steps = [(preprocess, 1.0, pre), ("resnet50", 1.0 + rng.uniform(0, 0.3), net)]
        if postprocess:
            steps.append((postprocess, 0.5, 2.0 + rng.uniform(0, 0.2)))
        spans, end = triton_ensemble_request(rng, seq, t, ensemble="image_pipeline", steps=steps)
        lines.append(_export(TRITON_RESOURCE, "triton-server", spans))
        t = end + 50 * MS
    path.write_text("\n".join(lines) + "\n")
    return path
