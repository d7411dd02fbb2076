"""MOSS-TTS-Nano's local transformer in ONNX Runtime: one graph run a local position (docs/nano.md, "Speed").

A frame's local pass is 17 single-row steps of a 1-layer transformer; each step reads all its weights, and ONNX
Runtime's ``MatMulNBits`` with int8 activations runs such a step faster than llama.cpp's Q8_0 product (the
figures: docs/nano.md, "Speed"), so the local pass runs here, from the local GGUF that ``convert``
writes beside the global one: Q8_0 matrices become ``MatMulNBits`` blocks of the very same 8-bit weights (a
re-layout: each code + 128, each float16 scale widened), float matrices a float32 ``MatMul`` (the exact path).

The block is the one llama.cpp's CodeShell runs (``tools/prepare/codeshell_gguf.py``): pre-LayerNorm with bias, a
fused biased QKV whose query and key rows are in rope halves (NEOX rotation), causal attention, a biased GELU (tanh)
MLP, a final LayerNorm. The KV cache is one frame's: fixed (heads, positions, head_dim) arrays with an additive mask,
bound once; a step's key and value come out of the graph and are written into the next slot.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from moss_tts_node.errors import WeightsError

_ARCH = "codeshell"
_Q8_BLOCK = 32  # GGML's Q8_0 block: a float16 scale, then 32 int8 weights
_MASKED = np.float32(-1e30)  # a masked slot's additive score: its softmax weight underflows to exactly 0


class OnnxLocalTransformer:
    """The local transformer of a GGUF (arch codeshell) over up to ``positions`` rows between ``clear`` calls, fed
    embedding rows as ``Backbone`` is. Not thread-safe: one caller at a time."""

    def __init__(self, gguf_path: Path, positions: int) -> None:
        settings, tensors = read_codeshell_gguf(Path(gguf_path))
        self.n_embd = hidden = settings["embedding_length"]
        heads, layers = settings["attention.head_count"], settings["block_count"]
        head_dim = hidden // heads
        self.positions = positions
        self._session = _local_session(
            tensors, hidden, heads, layers, positions, settings["attention.layer_norm_epsilon"]
        )
        self._cos, self._sin = _rope_tables(positions, head_dim, settings["rope.freq_base"])
        self._x = np.zeros((1, hidden), dtype=np.float32)
        self._angle = {
            "cos": np.zeros((1, head_dim), dtype=np.float32),
            "sin": np.zeros((1, head_dim), dtype=np.float32),
        }
        self._mask = np.full((1, positions), _MASKED, dtype=np.float32)
        self._past = {
            f"{kind}_{layer}": np.zeros((heads, positions, head_dim), dtype=np.float32)
            for layer in range(layers)
            for kind in ("past_k", "past_v")
        }
        self._hidden = np.zeros((1, hidden), dtype=np.float32)
        self._new = {
            f"{kind}_{layer}": np.zeros((heads, 1, head_dim), dtype=np.float32)
            for layer in range(layers)
            for kind in ("k", "v")
        }
        binding = self._binding = self._session.io_binding()
        for name, array in (("x", self._x), *self._angle.items(), ("mask", self._mask), *self._past.items()):
            binding.bind_cpu_input(name, array)
        for name, array in (("hidden", self._hidden), *self._new.items()):
            binding.bind_output(name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)
        self._layers = layers
        self._position = 0

    @property
    def position(self) -> int:
        """Rows decoded since the last ``clear``."""
        return self._position

    def clear(self) -> None:
        """Forget the rows: the next ``decode`` is position 0."""
        self._mask.fill(_MASKED)
        self._position = 0

    def decode(self, embedding: np.ndarray) -> None:
        """Append one (n_embd,) row."""
        t = self._position
        if t >= self.positions:
            raise ValueError(f"the local transformer holds {self.positions} positions; clear it first")
        self._x[0] = embedding
        self._angle["cos"][0], self._angle["sin"][0] = self._cos[t], self._sin[t]
        self._session.run_with_iobinding(self._binding)
        for layer in range(self._layers):
            self._past[f"past_k_{layer}"][:, t] = self._new[f"k_{layer}"][:, 0]
            self._past[f"past_v_{layer}"][:, t] = self._new[f"v_{layer}"][:, 0]
        self._mask[0, t] = 0
        self._position = t + 1

    def hidden(self) -> np.ndarray:
        """The last row's final-normed hidden state, (n_embd,) float32: a buffer the next ``decode`` overwrites."""
        return self._hidden[0]

    def close(self) -> None:
        self._binding = self._session = None


def read_codeshell_gguf(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The settings (``codeshell.*`` keys, without the prefix) and the block's tensors of a GGUF of ``convert``'s:
    vectors as float32, matrices as (N, K) float32 or, for Q8_0, as ``("q8", codes, scales)`` in ``MatMulNBits``'
    layout (``model/q8_blocks.py``)."""
    from gguf import GGMLQuantizationType, GGUFReader

    try:
        reader = GGUFReader(path)
    except (OSError, ValueError) as error:
        raise WeightsError(f"{path} is not a readable GGUF ({error}); convert the checkpoint again") from error
    arch_field = reader.fields.get("general.architecture")
    arch = bytes(arch_field.parts[arch_field.data[0]]).decode() if arch_field is not None else None
    if arch != _ARCH:
        raise WeightsError(f"{path}: architecture {arch!r}, not MOSS-TTS-Nano's local transformer ({_ARCH})")
    settings = {}
    for key, field in reader.fields.items():
        if key.startswith(f"{_ARCH}.") and field.data:
            value = field.parts[field.data[0]][0]
            settings[key.removeprefix(f"{_ARCH}.")] = value.item()
    tensors: dict[str, Any] = {}
    for tensor in reader.tensors:
        kind = tensor.tensor_type
        if kind == GGMLQuantizationType.Q8_0:
            rows, k = int(tensor.shape[1]), int(tensor.shape[0])
            blocks = np.asarray(tensor.data).reshape(rows, k // _Q8_BLOCK, 2 + _Q8_BLOCK)
            scales = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16).astype(np.float32).reshape(-1)
            codes = (blocks[:, :, 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
            tensors[tensor.name] = ("q8", codes, scales)
        elif kind in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            tensors[tensor.name] = np.asarray(tensor.data, dtype=np.float32)
        elif tensor.name.startswith("blk.") or tensor.name.startswith("output_norm"):
            raise WeightsError(
                f"{path}: {tensor.name} is {kind.name}; the local transformer takes F32, F16 or Q8_0 (convert writes "
                "Q8_0 by default)"
            )
    return settings, tensors


def _rope_tables(positions: int, head_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of each position's angles, (positions, head_dim), for a rotation of halves (NEOX)."""
    inv_freq = base ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angles = np.arange(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _local_session(tensors: dict[str, Any], hidden: int, heads: int, layers: int, positions: int, eps: float) -> Any:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    head_dim = hidden // heads
    nodes: list[Any] = []
    initializers: list[Any] = []

    def constant(name: str, value: np.ndarray) -> str:
        initializers.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def tensor(name: str) -> Any:
        if name not in tensors:
            raise WeightsError(f"the local transformer's GGUF has no {name}; convert the checkpoint again")
        return tensors[name]

    def node(op: str, inputs: list[str], output: str, domain: str = "", **attributes: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [output], domain=domain, **attributes))
        return output

    def linear(x: str, prefix: str) -> str:
        weight = tensor(f"{prefix}.weight")
        if isinstance(weight, tuple):
            _, codes, scales = weight
            n, k = codes.shape[0], codes.shape[1] * codes.shape[2]
            product = node(
                "MatMulNBits",
                [x, constant(f"{prefix}.codes", codes), constant(f"{prefix}.scales", scales)],
                f"{prefix}.product",
                domain="com.microsoft",
                K=k,
                N=n,
                bits=8,
                block_size=_Q8_BLOCK,
                accuracy_level=4,  # int8 activations, as llama.cpp's Q8_0 products quantize them
            )
        else:
            product = node("MatMul", [x, constant(f"{prefix}.weight", weight.T.copy())], f"{prefix}.product")
        return node("Add", [product, constant(f"{prefix}.bias", tensor(f"{prefix}.bias"))], f"{prefix}.out")

    def norm(x: str, prefix: str) -> str:
        weight, bias = (
            constant(f"{prefix}.weight", tensor(f"{prefix}.weight")),
            constant(f"{prefix}.bias", tensor(f"{prefix}.bias")),
        )
        return node("LayerNormalization", [x, weight, bias], f"{prefix}.out", axis=-1, epsilon=float(eps))

    half = head_dim // 2
    heads_shape = constant("heads_shape", np.array([heads, 1, head_dim], dtype=np.int64))
    row_shape = constant("row_shape", np.array([1, hidden], dtype=np.int64))
    split = constant("qkv_split", np.array([hidden, hidden, hidden], dtype=np.int64))
    scale = constant("scale", np.array(1.0 / np.sqrt(head_dim), dtype=np.float32))
    starts, middles, ends = (
        constant(n, np.array([v], dtype=np.int64)) for n, v in (("s0", 0), ("s1", half), ("s2", head_dim))
    )
    axis2 = constant("axis2", np.array([2], dtype=np.int64))
    current = constant("current", np.zeros((1, 1), dtype=np.float32))
    mask = node("Concat", ["mask", current], "mask_now", axis=1)

    def rotated(x: str) -> str:  # x * cos + rotate_half(x) * sin, rotate_half(x) = (-x2, x1)
        first = node("Slice", [x, starts, middles, axis2], f"{x}.first")
        second = node("Slice", [x, middles, ends, axis2], f"{x}.second")
        turned = node("Concat", [node("Neg", [second], f"{x}.neg"), first], f"{x}.turned", axis=2)
        return node("Add", [node("Mul", [x, "cos"], f"{x}.cos"), node("Mul", [turned, "sin"], f"{x}.sin")], f"{x}.rot")

    x = "x"
    outputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, hidden])]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, hidden]),
        helper.make_tensor_value_info("cos", TensorProto.FLOAT, [1, head_dim]),
        helper.make_tensor_value_info("sin", TensorProto.FLOAT, [1, head_dim]),
        helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, positions]),
    ]
    for layer in range(layers):
        block = f"blk.{layer}"
        qkv = linear(norm(x, f"{block}.attn_norm"), f"{block}.attn_qkv")
        nodes.append(helper.make_node("Split", [qkv, split], [f"{block}.q", f"{block}.k", f"{block}.v"], axis=1))
        q, k, v = (node("Reshape", [f"{block}.{p}", heads_shape], f"{block}.{p}.heads") for p in "qkv")
        q, k = rotated(q), rotated(k)
        node("Identity", [k], f"k_{layer}")
        node("Identity", [v], f"v_{layer}")
        keys = node("Concat", [f"past_k_{layer}", k], f"{block}.keys", axis=1)
        values = node("Concat", [f"past_v_{layer}", v], f"{block}.values", axis=1)
        scores = node("MatMul", [q, node("Transpose", [keys], f"{block}.keys_t", perm=[0, 2, 1])], f"{block}.scores")
        scores = node("Add", [node("Mul", [scores, scale], f"{block}.scaled"), mask], f"{block}.masked")
        weights = node("Softmax", [scores], f"{block}.weights", axis=-1)
        attended = node("Reshape", [node("MatMul", [weights, values], f"{block}.attended"), row_shape], f"{block}.row")
        x = node("Add", [x, linear(attended, f"{block}.attn_output")], f"{block}.after_attn")
        up = linear(norm(x, f"{block}.ffn_norm"), f"{block}.ffn_up")
        gelu = node("Gelu", [up], f"{block}.gelu", approximate="tanh")
        x = node("Add", [x, linear(gelu, f"{block}.ffn_down")], f"{block}.out")
        for kind in ("k", "v"):
            inputs.append(
                helper.make_tensor_value_info(f"past_{kind}_{layer}", TensorProto.FLOAT, [heads, positions, head_dim])
            )
            outputs.append(helper.make_tensor_value_info(f"{kind}_{layer}", TensorProto.FLOAT, [heads, 1, head_dim]))
    node("Identity", [norm(x, "output_norm")], "hidden")
    graph = helper.make_graph(nodes, "moss_tts_nano_local", inputs, outputs, initializer=initializers)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 9
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # on the calling thread: the generating one (docs/design.md, "Threads")
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=["CPUExecutionProvider"])
