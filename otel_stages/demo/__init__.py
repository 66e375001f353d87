"""The built-in demo: a traced image + prompt inference pipeline on real parts, all local.

* :mod:`~otel_stages.demo.images` makes photo-like JPEGs (fixed photo, thumbnails, 12 MP photos,
  one truncated file);
* :mod:`~otel_stages.demo.server` serves them over HTTP on 127.0.0.1;
* :mod:`~otel_stages.demo.model` builds a small vision-encoder-like ONNX graph with random
  weights and runs it with ONNX Runtime on the CPU;
* :mod:`~otel_stages.demo.worker` is the inference worker: a queue and one batching executor;
* :mod:`~otel_stages.demo.pipeline` runs the plan: download -> decode -> resize -> queue -> forward.

``otel-stages demo`` (:mod:`otel_stages.commands.demo`) wires them to ``configure()`` and the
report. Needs the ``demo`` extra (onnx, onnxruntime, numpy).
"""
