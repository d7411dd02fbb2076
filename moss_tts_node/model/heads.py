"""The audio heads (one per codebook: 32 for MOSS-TTS, 16 for the family's others), and the text head's shortcut
in the audio phase.

The audio heads (n_vq x 1025 x H, read in full every step) run on one of three backends, ``heads_backend``:

- ``gguf``: inside llama.cpp's graph. The GGUF's output matrix carries the n_vq heads after the text
  vocabulary (``python -m moss_tts_node attach-heads`` makes such a file; the metadata key ``moss_tts.audio_heads``
  marks it), so they are quantized with the model, computed by llama.cpp's threads, and on the GPU when
  the layers are. The text head runs every step.
- ``onnx``: one 8-bit block-quantized GEMV (ONNX Runtime ``MatMulNBits``, blocks of 32, 0.14 GB),
  quantized at load from the float16 files; faster than float32 BLAS on a CPU (docs/speed.md, "The step loop").
- ``numpy``: the exact path: float32 BLAS GEMV over the widened heads (0.54 GB at the real shape) laid
  out (H, rows), the orientation OpenBLAS streams fastest; only the channels sampled are computed.

``auto`` picks ``gguf`` when the GGUF carries the heads and llama.cpp offloads layers to a GPU, else
``onnx``: on a CPU, skipping the text head (below) and running 8-bit heads beats computing both in
llama.cpp (``python -m moss_tts_node bench`` measures it; docs/speed.md, "The step loop").

Outside llama.cpp the text head is skipped on the steps that need no text logits, or only the two the
audio phase can sample (``gen_slot``/``delay_slot``): those two are computed here from the hidden state,
with the GGUF's own (dequantized) text-head rows. That saves the 155,648-row text head on every step of
the audio phase (docs/speed.md, "The step loop", has the figures).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from moss_tts_node.choices import HEADS_BACKENDS
from moss_tts_node.errors import WeightsError
from moss_tts_node.llama.bindings import llama_supports_gpu_offload
from moss_tts_node.llama.gguf import GGUF_AUDIO_HEADS_KEY, GgufHeadsInfo
from moss_tts_node.model.delay import TextRule
from moss_tts_node.model.embeddings import load_matrix
from moss_tts_node.model.layout import audio_head_file
from moss_tts_node.model.q8_blocks import quantize_q8_blocks
from moss_tts_node.model.spec import ModelSpec

ONNX_HEADS_BLOCK = 32  # quantization block along H (MatMulNBits block_size)


class StepLogits(NamedTuple):
    """One step's logits. ``text`` None: the text token is forced. ``text_ids`` None: ``text`` is indexed by
    token id (the whole text vocabulary); else ``text[i]`` is the logit of ``text_ids[i]``. ``audio`` is
    (n_vq, audio_rows); rows of channels not sampled this step may be stale and must not be read."""

    text: np.ndarray | None
    text_ids: tuple[int, ...] | None
    audio: np.ndarray


class StepInputs(NamedTuple):
    """Which of the backbone's outputs of the last decode a step's logits are computed from."""

    hidden: bool  # the final-normed hidden state
    text_logits: bool  # llama.cpp's logits (text, and the audio heads when the GGUF carries them)


class TextHeadInfo(NamedTuple):
    """What the heads need of the GGUF's text head."""

    ids: tuple[int, ...] = ()  # text tokens whose logits the audio phase samples (gen_slot, delay_slot)
    rows: np.ndarray | None = None  # their text-head rows, (len(ids), H) float32; None: use llama.cpp's head
    vocab: int | None = None  # set when the output matrix also carries the audio heads: its text rows


NO_TEXT_SHORTCUT = TextHeadInfo()  # llama.cpp's text head on every text step; a GGUF without the audio heads


class AudioHeads:
    """Audio logits for a step, and (outside llama.cpp) the few text logits the audio phase samples from.

    With ``text.rows`` the steps that sample only ``text.ids`` compute those logits here and skip
    llama.cpp's text head. With ``text.vocab`` (a GGUF whose output matrix also carries the audio heads,
    whichever backend computes them) llama.cpp's logits are ``vocab`` text logits followed by the heads'
    rows, which text sampling must never see.
    """

    name = "base"
    in_backbone = False  # the logits come from llama.cpp's output matrix

    def __init__(self, spec: ModelSpec, text: TextHeadInfo = NO_TEXT_SHORTCUT) -> None:
        self.spec = spec
        self.text_vocab = text.vocab
        self.text_ids = text.ids if text.rows is not None else ()
        self._text_rows = text.rows
        self._text_index = {t: i for i, t in enumerate(self.text_ids)}
        self._logits = np.zeros((spec.n_vq, spec.audio_rows), dtype=np.float32)

    def wants_text_head(self, rule: TextRule) -> bool:
        """Whether the decode that feeds a step sampled with ``rule`` must run llama.cpp's text head."""
        if self.in_backbone:
            return True
        if rule.forced is not None:
            return False
        if rule.allowed is None:
            return True
        return not all(t in self._text_index for t in rule.allowed if t not in rule.banned)

    def inputs(self, rule: TextRule, channels: np.ndarray) -> StepInputs:
        """What ``step`` needs of the last decode for a step sampled with ``rule`` and ``channels``."""
        text_logits = self.wants_text_head(rule)
        return StepInputs(
            hidden=bool(channels.any()) or (rule.forced is None and not text_logits), text_logits=text_logits
        )

    def step(
        self, rule: TextRule, channels: np.ndarray, hidden: np.ndarray | None, text_logits: np.ndarray | None
    ) -> StepLogits:
        """The logits a step sampled with ``rule`` and ``channels`` needs, from the decode outputs that
        ``inputs`` asked for (None for those it did not)."""
        text: np.ndarray | None = None
        ids: tuple[int, ...] | None = None
        if rule.forced is None:
            if text_logits is not None:
                text = text_logits[: self.text_vocab]  # [:None]: all of them
            else:
                assert self._text_rows is not None and hidden is not None
                text, ids = self._text_rows @ hidden, self.text_ids
        if channels.any():
            assert hidden is not None
            self._audio(hidden, channels)
        return StepLogits(text, ids, self._logits)

    def _audio(self, hidden: np.ndarray, channels: np.ndarray) -> None:
        """Fill the rows of ``self._logits`` for the channels set in ``channels`` (never empty)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the backend's memory (sessions, widened weights)."""


class GgufAudioHeads(AudioHeads):
    """The heads inside llama.cpp's output matrix, after ``text_vocab`` text rows."""

    name = "gguf"
    in_backbone = True

    def __init__(self, spec: ModelSpec, text_vocab: int) -> None:
        super().__init__(spec, TextHeadInfo(vocab=text_vocab))
        self.text_vocab: int = text_vocab  # never None here

    def inputs(self, rule: TextRule, channels: np.ndarray) -> StepInputs:
        # text and audio logits, one copy out of llama.cpp; none when nothing is sampled
        return StepInputs(hidden=False, text_logits=rule.forced is None or bool(channels.any()))

    def step(
        self, rule: TextRule, channels: np.ndarray, hidden: np.ndarray | None, text_logits: np.ndarray | None
    ) -> StepLogits:
        spec = self.spec
        text = None
        if text_logits is not None:
            audio = text_logits[self.text_vocab : self.text_vocab + spec.n_vq * spec.audio_rows]
            self._logits = audio.reshape(spec.n_vq, spec.audio_rows)
            if rule.forced is None:
                text = text_logits[: self.text_vocab]
        return StepLogits(text, None, self._logits)


class NumpyAudioHeads(AudioHeads):
    """Exact: the float16 heads widened to one float32 (H, n_vq * 1025) block, BLAS GEMV per step.

    Only the span of channels sampled is computed (a prefix during the ramp-up, a suffix during the
    flush: one strided GEMV either way).
    """

    name = "numpy"

    def __init__(self, heads_dir: Path, spec: ModelSpec, hidden: int, text: TextHeadInfo = NO_TEXT_SHORTCUT) -> None:
        super().__init__(spec, text)
        rows = spec.audio_rows
        self.weights = np.empty((hidden, spec.n_vq * rows), dtype=np.float32)
        for k, head in enumerate(read_heads(heads_dir, spec, hidden)):
            self.weights[:, k * rows : (k + 1) * rows] = head.T
        self._flat = self._logits.reshape(-1)

    def _audio(self, hidden: np.ndarray, channels: np.ndarray) -> None:
        index = np.flatnonzero(channels)
        rows = self.spec.audio_rows
        lo, hi = int(index[0]) * rows, (int(index[-1]) + 1) * rows
        np.matmul(hidden, self.weights[:, lo:hi], out=self._flat[lo:hi])

    def close(self) -> None:
        self.weights = np.empty((0, 0), dtype=np.float32)


class OnnxAudioHeads(AudioHeads):
    """8-bit heads in one ONNX Runtime ``MatMulNBits`` (blocks of 32 along H, int8 activations).

    Threads: ``threads`` intra-op threads that sleep instead of spinning when idle (llama.cpp's threads
    are idle while the heads run, and need the cores right after). The logits differ from the float16
    heads' by the 8-bit rounding (about 1% of their spread); ``numpy`` is the exact path.
    """

    name = "onnx"

    def __init__(
        self,
        heads_dir: Path,
        spec: ModelSpec,
        hidden: int,
        text: TextHeadInfo = NO_TEXT_SHORTCUT,
        threads: int = 1,
        providers: Sequence[str] = ("CPUExecutionProvider",),
    ) -> None:
        super().__init__(spec, text)
        if hidden % ONNX_HEADS_BLOCK:
            raise WeightsError(f"the onnx heads need a hidden size divisible by {ONNX_HEADS_BLOCK}, got {hidden}")
        n = spec.n_vq * spec.audio_rows
        self._matvec = Q8MatVec(quantize_heads_q8(read_heads(heads_dir, spec, hidden), n, hidden), threads, providers)
        self._logits = self._matvec.output.reshape(spec.n_vq, spec.audio_rows)

    def _audio(self, hidden: np.ndarray, channels: np.ndarray) -> None:
        self._matvec(hidden)

    def close(self) -> None:
        self._matvec.close()


class Q8MatVec:
    """``W @ hidden`` for one float32 hidden row, W in MatMulNBits' 8-bit blocks (``quantize_heads_q8``), through
    one ONNX Runtime session bound once: each call writes the row in place and ORT writes ``output`` in place
    (the same array every call)."""

    def __init__(self, q8: tuple[np.ndarray, np.ndarray], threads: int, providers: Sequence[str]) -> None:
        codes = q8[0]
        self._q8 = q8  # ORT reads these in place
        self._session: Any = _heads_session(q8, threads, providers)
        self._input = np.zeros((1, codes.shape[1] * codes.shape[2]), dtype=np.float32)
        self.output = np.empty(codes.shape[0], dtype=np.float32)
        self._binding: Any = self._session.io_binding()
        self._binding.bind_cpu_input("hidden", self._input)
        self._binding.bind_output("logits", "cpu", 0, np.float32, [1, codes.shape[0]], self.output.ctypes.data)

    def __call__(self, hidden: np.ndarray) -> np.ndarray:
        self._input[0] = hidden
        self._session.run_with_iobinding(self._binding)
        return self.output

    def close(self) -> None:
        self._binding = self._session = None


def quantize_heads_q8(heads: Iterator[np.ndarray], rows: int, hidden: int) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits 8-bit blocks of ``rows`` stacked head rows (``model/q8_blocks.py``): (rows, H / 32, 32)
    uint8 codes and (rows * H / 32,) float32 scales, filled one head at a time."""
    n_blocks = hidden // ONNX_HEADS_BLOCK
    codes = np.empty((rows, n_blocks, ONNX_HEADS_BLOCK), dtype=np.uint8)
    scales = np.empty((rows, n_blocks), dtype=np.float32)
    start = 0
    for head in heads:
        end = start + head.shape[0]
        codes[start:end], scales[start:end] = quantize_q8_blocks(head, ONNX_HEADS_BLOCK)
        start = end
    if start != rows:
        raise WeightsError(f"the heads hold {start} rows, expected {rows}")
    return codes, scales.reshape(-1)


def _heads_session(q8: tuple[np.ndarray, np.ndarray], threads: int, providers: Sequence[str]) -> Any:
    """One MatMulNBits session over ``q8``, which it reads in place (external initializers): the caller
    keeps the arrays alive as long as the session. ORT adds its own packed copy (same size)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    codes, scales = q8
    n, hidden = codes.shape[0], codes.shape[1] * codes.shape[2]
    node = helper.make_node(
        "MatMulNBits",
        ["hidden", "codes", "scales"],
        ["logits"],
        domain="com.microsoft",
        K=hidden,
        N=n,
        bits=8,
        block_size=ONNX_HEADS_BLOCK,
        accuracy_level=4,  # int8 activations: the fast kernel (the float one dequantizes every call)
    )
    graph = helper.make_graph(
        [node],
        "moss_audio_heads",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, hidden])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, n])],
        initializer=[
            _external_stub("codes", codes, TensorProto.UINT8),
            _external_stub("scales", scales, TensorProto.FLOAT),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = max(threads, 1)
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    # Initializers handed over as OrtValues over our arrays: no copy in the model bytes or in ORT.
    options.add_external_initializers(
        ["codes", "scales"], [ort.OrtValue.ortvalue_from_numpy(codes), ort.OrtValue.ortvalue_from_numpy(scales)]
    )
    return ort.InferenceSession(model.SerializeToString(), sess_options=options, providers=list(providers))


def _external_stub(name: str, array: np.ndarray, data_type: int) -> Any:
    """An initializer that says "external data": its bytes come from SessionOptions' external initializers."""
    from onnx import TensorProto

    tensor = TensorProto(name=name, data_type=data_type, dims=array.shape, data_location=TensorProto.EXTERNAL)
    for key, value in (("location", "moss_tts_heads"), ("offset", "0"), ("length", str(array.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def read_heads(heads_dir: Path, spec: ModelSpec, hidden: int) -> Iterator[np.ndarray]:
    """The n_vq float16 heads, one at a time (memory-mapped)."""
    heads_dir = Path(heads_dir)
    for k in range(spec.n_vq):
        yield load_matrix(heads_dir / audio_head_file(k), spec.audio_rows, hidden)


def load_audio_heads(
    backend: str,
    heads_dir: Path,
    spec: ModelSpec,
    hidden: int,
    gguf_path: Path,
    threads: int = 0,
    n_gpu_layers: int = 0,
    providers: Sequence[str] = ("CPUExecutionProvider",),
) -> AudioHeads:
    """The heads for ``backend`` (one of HEADS_BACKENDS) and the backbone GGUF ``gguf_path``.

    ``threads``: the onnx heads' threads, 0 = every core (they run while llama.cpp's threads wait).
    ``auto`` takes the GGUF's heads only when llama.cpp runs layers on a GPU: on a CPU the text head
    skip plus the 8-bit onnx heads is faster (docs/speed.md, "The step loop"),
    because the GGUF's heads cannot run without the whole text head.
    ``text_vocab`` of the result is the size of the GGUF's text vocabulary when it carries the heads.
    """
    gguf = GgufHeadsInfo(gguf_path)
    if backend == "auto":
        on_gpu = n_gpu_layers != 0 and llama_supports_gpu_offload()
        backend = resolve_heads_backend(backend, gguf.audio_heads is not None, on_gpu)
    return _load_audio_heads(backend, heads_dir, spec, hidden, gguf, threads or os.cpu_count() or 1, providers)


def resolve_heads_backend(backend: str, gguf_carries_heads: bool, layers_on_gpu: bool) -> str:
    """What ``auto`` means: the GGUF's heads when it carries them and llama.cpp runs layers on a GPU, else
    the 8-bit onnx heads (with the text-head skip, faster on a CPU). Other backends are themselves."""
    if backend != "auto":
        return backend
    return "gguf" if gguf_carries_heads and layers_on_gpu else "onnx"


def _load_audio_heads(
    backend: str,
    heads_dir: Path,
    spec: ModelSpec,
    hidden: int,
    gguf: GgufHeadsInfo,
    threads: int,
    providers: Sequence[str],
) -> AudioHeads:
    if backend not in HEADS_BACKENDS:
        raise WeightsError(f"heads_backend {backend!r} is not one of {', '.join(HEADS_BACKENDS)}")
    carried = gguf.audio_heads is not None
    if carried and gguf.audio_heads != spec.n_vq:
        raise WeightsError(f"{gguf.path} carries {gguf.audio_heads} audio heads, the model has {spec.n_vq}")
    if backend == "gguf":
        if not carried or gguf.text_vocab is None:
            raise WeightsError(
                f"heads_backend 'gguf' needs a GGUF that carries the audio heads, and {gguf.path} does not "
                f"(no '{GGUF_AUDIO_HEADS_KEY}' key); make one with `python -m moss_tts_node attach-heads`, or "
                "use 'auto', 'onnx' or 'numpy'"
            )
        return GgufAudioHeads(spec, gguf.text_vocab)
    text_ids = (spec.audio_assistant_gen_slot_token_id, spec.audio_assistant_delay_slot_token_id)
    text_rows = gguf.text_head_rows(text_ids)
    if text_rows is not None and text_rows.shape[1] != hidden:
        text_rows = None
    text = TextHeadInfo(text_ids, text_rows, gguf.text_vocab if carried else None)
    if backend == "numpy":
        return NumpyAudioHeads(heads_dir, spec, hidden, text)
    return OnnxAudioHeads(heads_dir, spec, hidden, text, threads, providers)
