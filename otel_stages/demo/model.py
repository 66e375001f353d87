"""A small vision-encoder-like network, built locally as an ONNX graph and run by ONNX Runtime.

Nothing is downloaded: :func:`build_model` writes the graph with ``onnx.helper`` and fills it with
seeded random weights (ViT-style init: normal, std 0.02). The shape of the computation is that of
a ViT-Tiny-sized image+prompt encoder:

    pixels   float32 [B, 3, S, S]  (0..1, S = image_size)   -> normalise (ImageNet mean/std)
             -> patch embedding Conv(k = stride = patch) -> [B, dim, S/p, S/p] -> [B, P, dim]
             -> + position embedding
    prompt   int64   [B, T]  (byte tokens, see tokenize)     -> embedding Gather -> [B, T, dim]
    tokens   concat -> [B, P + T, dim]
             -> depth x (pre-LN multi-head self-attention + pre-LN MLP with GELU, residuals)
             -> LayerNorm -> mean over tokens
    output   float32 [B, dim]  "embedding"

:class:`Encoder` runs it on the CPU with a fixed, small thread count (reproducible on 2 cores).
The ONNX Runtime session is created *lazily*, on the first :meth:`Encoder.run`, so the model load
(graph optimisation, allocation, first-run warm-up) lands inside the first request's ``forward``
span: a real, visible cold start.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  #: LayerNormalization needs 17; GELU is written with Erf so older runtimes work
INPUT_PIXELS = "pixels"
INPUT_PROMPT = "prompt_ids"
OUTPUT = "embedding"
_MEAN = (0.485, 0.456, 0.406)
_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class EncoderConfig:
    """Sizes of the network. ``image_size`` pixels (square), ``patch`` pixels (divides image_size),
    ``dim`` channels (divisible by ``heads``), ``depth`` blocks, ``prompt_len`` tokens,
    ``mlp_ratio`` hidden/dim. Defaults are ViT-Tiny-sized (12 blocks of 192, 3 heads; ~2.5 GFLOP
    per image)."""

    image_size: int = 224
    patch: int = 16
    dim: int = 192
    heads: int = 3
    depth: int = 12
    prompt_len: int = 16
    mlp_ratio: int = 4

    def __post_init__(self) -> None:
        if self.image_size % self.patch or self.dim % self.heads:
            raise ValueError(f"EncoderConfig: image_size {self.image_size} must be a multiple of "
                             f"patch {self.patch} and dim {self.dim} of heads {self.heads}")

    @property
    def patches(self) -> int:
        """Image tokens per image: (image_size / patch) ** 2."""
        return (self.image_size // self.patch) ** 2

    @property
    def vocab(self) -> int:
        """Prompt vocabulary: 256 byte values + 1 padding id (0)."""
        return 257


def tokenize(prompt: str, length: int) -> np.ndarray:
    """Byte-level tokens of ``prompt``: int64 ``[length]``, UTF-8 byte + 1, 0-padded / truncated."""
    ids = np.zeros(length, dtype=np.int64)
    raw = np.frombuffer(prompt.encode("utf-8")[:length], dtype=np.uint8).astype(np.int64) + 1
    ids[: raw.size] = raw
    return ids


class _Graph:
    """Accumulates nodes and initializers while the graph is written."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self._n = 0

    def name(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def const(self, hint: str, value: np.ndarray) -> str:
        name = self.name(hint)
        self.weights.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def random(self, hint: str, shape: tuple[int, ...], std: float = 0.02) -> str:
        return self.const(hint, (self.rng.standard_normal(shape) * std).astype(np.float32))

    def op(self, op_type: str, inputs: list[str], hint: str | None = None, **attrs: Any) -> str:
        out = self.name(hint or op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def layer_norm(self, x: str, dim: int) -> str:
        gamma = self.const("ln_scale", np.ones(dim, np.float32))
        beta = self.const("ln_bias", np.zeros(dim, np.float32))
        return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-6)

    def linear(self, x: str, n_in: int, n_out: int) -> str:
        w = self.random("w", (n_in, n_out))
        b = self.const("b", np.zeros(n_out, np.float32))
        return self.op("Add", [self.op("MatMul", [x, w]), b])

    def gelu(self, x: str) -> str:
        """0.5 * x * (1 + erf(x / sqrt(2)))."""
        scaled = self.op("Mul", [x, self.const("inv_sqrt2", np.array(1 / math.sqrt(2), np.float32))])
        one_plus = self.op("Add", [self.op("Erf", [scaled]), self.const("one", np.array(1.0, np.float32))])
        half_x = self.op("Mul", [x, self.const("half", np.array(0.5, np.float32))])
        return self.op("Mul", [half_x, one_plus])

    def attention(self, x: str, cfg: EncoderConfig) -> str:
        dh = cfg.dim // cfg.heads
        split = self.const("heads_shape", np.array([0, 0, cfg.heads, dh], np.int64))
        merge = self.const("merge_shape", np.array([0, 0, cfg.dim], np.int64))

        def heads(t: str, perm: list[int]) -> str:  # [B, N, dim] -> [B, H, N, dh] (or K^T)
            return self.op("Transpose", [self.op("Reshape", [t, split])], perm=perm)

        q = heads(self.linear(x, cfg.dim, cfg.dim), [0, 2, 1, 3])
        k_t = heads(self.linear(x, cfg.dim, cfg.dim), [0, 2, 3, 1])
        v = heads(self.linear(x, cfg.dim, cfg.dim), [0, 2, 1, 3])
        scale = self.const("attn_scale", np.array(1 / math.sqrt(dh), np.float32))
        scores = self.op("Mul", [self.op("MatMul", [q, k_t]), scale])
        mixed = self.op("MatMul", [self.op("Softmax", [scores], axis=-1), v])
        merged = self.op("Reshape", [self.op("Transpose", [mixed], perm=[0, 2, 1, 3]), merge])
        return self.linear(merged, cfg.dim, cfg.dim)


def build_model(config: EncoderConfig | None = None, seed: int = 0) -> onnx.ModelProto:
    """Write the encoder graph (see module docstring) with random weights drawn from ``seed``.

    Inputs ``pixels`` float32 ``[B, 3, S, S]`` and ``prompt_ids`` int64 ``[B, T]``; output
    ``embedding`` float32 ``[B, dim]``; ``B`` is dynamic. The model passes ``onnx.checker``.
    """
    cfg = config or EncoderConfig()
    g = _Graph(np.random.default_rng(seed))
    mean = g.const("mean", np.array(_MEAN, np.float32).reshape(1, 3, 1, 1))
    std = g.const("std", np.array(_STD, np.float32).reshape(1, 3, 1, 1))
    x = g.op("Div", [g.op("Sub", [INPUT_PIXELS, mean]), std], "normalised")
    conv_w = g.random("patch_w", (cfg.dim, 3, cfg.patch, cfg.patch))
    conv_b = g.const("patch_b", np.zeros(cfg.dim, np.float32))
    x = g.op("Conv", [x, conv_w, conv_b], "patch_embed", kernel_shape=[cfg.patch, cfg.patch],
             strides=[cfg.patch, cfg.patch])
    x = g.op("Reshape", [x, g.const("flat", np.array([0, cfg.dim, -1], np.int64))])
    x = g.op("Transpose", [x], "image_tokens", perm=[0, 2, 1])
    x = g.op("Add", [x, g.random("pos_embed", (1, cfg.patches, cfg.dim))])
    words = g.op("Gather", [g.random("tok_embed", (cfg.vocab, cfg.dim)), INPUT_PROMPT], "prompt_tokens")
    x = g.op("Concat", [x, words], "tokens", axis=1)
    for _ in range(cfg.depth):
        x = g.op("Add", [x, g.attention(g.layer_norm(x, cfg.dim), cfg)], "attn_residual")
        hidden = g.gelu(g.linear(g.layer_norm(x, cfg.dim), cfg.dim, cfg.dim * cfg.mlp_ratio))
        x = g.op("Add", [x, g.linear(hidden, cfg.dim * cfg.mlp_ratio, cfg.dim)], "mlp_residual")
    pooled = g.op("ReduceMean", [g.layer_norm(x, cfg.dim)], "pooled", axes=[1], keepdims=0)
    g.nodes.append(helper.make_node("Identity", [pooled], [OUTPUT]))

    graph = helper.make_graph(
        g.nodes, "otel_stages_demo_encoder",
        [helper.make_tensor_value_info(INPUT_PIXELS, TensorProto.FLOAT,
                                       ["batch", 3, cfg.image_size, cfg.image_size]),
         helper.make_tensor_value_info(INPUT_PROMPT, TensorProto.INT64, ["batch", cfg.prompt_len])],
        [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", cfg.dim])],
        initializer=g.weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="otel_stages.demo")
    model.ir_version = 8  # readable by onnxruntime >= 1.14
    onnx.checker.check_model(model)
    return model


class Encoder:
    """Runs the encoder with ONNX Runtime on the CPU; the session is created on first :meth:`run`.

    ``threads`` is ONNX Runtime's intra-op thread count (1-2 keeps timings reproducible on a
    2-core machine). Thread-safe: the session is created once under a lock; ``run`` may be called
    from any thread (the demo calls it from one executor thread).
    """

    def __init__(self, config: EncoderConfig | None = None, *, seed: int = 0, threads: int = 1) -> None:
        self.config = config or EncoderConfig()
        self.threads = threads
        self._model_bytes = build_model(self.config, seed).SerializeToString()
        self._session: object | None = None
        self._lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        """Whether the runtime session exists yet (False until the first :meth:`run`)."""
        return self._session is not None

    def _load(self) -> object:
        with self._lock:
            if self._session is None:
                import onnxruntime as ort

                options = ort.SessionOptions()
                options.intra_op_num_threads = self.threads
                options.inter_op_num_threads = 1
                options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
                options.log_severity_level = 3  # errors only
                self._session = ort.InferenceSession(self._model_bytes, sess_options=options,
                                                     providers=["CPUExecutionProvider"])
            return self._session

    def run(self, pixels: np.ndarray, prompt_ids: np.ndarray) -> np.ndarray:
        """Encode a batch: ``pixels`` float32 ``[B, 3, S, S]`` in 0..1, ``prompt_ids`` int64
        ``[B, T]`` -> float32 ``[B, dim]``.

        Raises ``ValueError`` when the shapes do not match the config (before touching the
        runtime), and whatever ONNX Runtime raises if the run itself fails.
        """
        cfg = self.config
        expected = (3, cfg.image_size, cfg.image_size)
        if pixels.ndim != 4 or tuple(pixels.shape[1:]) != expected:
            raise ValueError(
                f"pixels: expected [B, {', '.join(map(str, expected))}], got {list(pixels.shape)}")
        if prompt_ids.shape != (pixels.shape[0], cfg.prompt_len):
            raise ValueError(f"prompt_ids: expected [{pixels.shape[0]}, {cfg.prompt_len}], "
                             f"got {list(prompt_ids.shape)}")
        session = self._session or self._load()
        (out,) = session.run([OUTPUT], {  # type: ignore[attr-defined]
            INPUT_PIXELS: np.ascontiguousarray(pixels, dtype=np.float32),
            INPUT_PROMPT: np.ascontiguousarray(prompt_ids, dtype=np.int64),
        })
        result: np.ndarray = out
        return result
