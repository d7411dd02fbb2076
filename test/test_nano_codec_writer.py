"""The torch-free Nano codec writer (tools/dev/nano_codec.py), held to upstream's PyTorch code.

The fixture test/data/nano-codec-tiny holds a tiny random Nano checkpoint in upstream's names, the graphs
upstream's own export wrote from it, and PyTorch's outputs (reference.npz, make_reference.py there): the
graphs written here from the same checkpoint must compute those outputs, under the same names and shapes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from moss_tts_node.codec.nano import NanoOnnxCodec  # noqa: E402
from moss_tts_node.tools.dev.nano_codec import (  # noqa: E402
    META_FILE,
    nano_config,
    write_nano_codec,
    write_random_nano_checkpoint,
    write_random_nano_codec,
)
from moss_tts_node.tools.prepare.safetensors_io import SafetensorsCheckpoint, write_safetensors  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "data" / "nano-codec-tiny"
# Relative to the largest sample of PyTorch's decode; measured 2.6e-7 (whole) and 2.9e-7 (streamed) on
# 2026-12-07, float32 rounding (sums in another order). Tight, because random weights at upstream's init
# (layer scale 0.01) make the audio barely depend on attention: caches that keep the wrong rows cost 3.7e-6.
DECODE_TOLERANCE = 1e-6
# The streaming state against the one upstream's exported decode_step carries, relative to its largest
# value; measured 1.4e-7. Keys are rotated by position, so any position or cache-row error shows here.
STATE_TOLERANCE = 1e-5


def _session(path: Path) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _sessions(directory: Path) -> dict[str, Any]:
    meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    return {role: _session(directory / name) for role, name in meta["files"].items()}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_nano_codec(FIXTURE, tmp_path_factory.mktemp("nano-codec"))


def _stream(
    session: Any, meta: dict[str, Any], codes: np.ndarray, chunks: list[int]
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Decode ``codes`` (F, nq) chunk by chunk as upstream's runtime does: the meta's state, zeros (positions
    -1) at first, each output fed back as the next call's input. Returns (samples, channels) and the state."""
    spec = meta["streaming_decode"]
    state: dict[str, np.ndarray] = {}
    links: list[tuple[str, str]] = []
    for entry in spec["transformer_offsets"]:
        state[entry["input_name"]] = np.zeros(entry["shape"], np.int32)
        links.append((entry["input_name"], entry["output_name"]))
    for entry in spec["attention_caches"]:
        state[entry["offset_input_name"]] = np.zeros(entry["offset_shape"], np.int32)
        state[entry["cached_keys_input_name"]] = np.zeros(entry["cache_shape"], np.float32)
        state[entry["cached_values_input_name"]] = np.zeros(entry["cache_shape"], np.float32)
        state[entry["cached_positions_input_name"]] = np.full(entry["positions_shape"], -1, np.int32)
        links += [
            (entry[f"{k}_input_name"], entry[f"{k}_output_name"])
            for k in ("offset", "cached_keys", "cached_values", "cached_positions")
        ]
    names = [output.name for output in session.get_outputs()]
    pieces, start = [], 0
    for size in chunks:
        feeds = {
            "audio_codes": codes[None, start : start + size].astype(np.int32),
            "audio_code_lengths": np.array([size], np.int32),
        }
        out = dict(zip(names, session.run(None, {**feeds, **state}), strict=True))
        pieces.append(out["audio"][0, :, : int(out["audio_lengths"][0])].T)
        state.update({source: out[target] for source, target in links})
        start += size
    return np.concatenate(pieces), state


def _decode_full(session: Any, codes: np.ndarray) -> np.ndarray:
    audio, lengths = session.run(
        None, {"audio_codes": codes[None].astype(np.int32), "audio_code_lengths": np.array([len(codes)], np.int32)}
    )
    return audio[0, :, : int(lengths[0])].T


def test_graphs_from_the_checkpoint_compute_what_pytorch_computes(written: Path) -> None:
    reference = np.load(FIXTURE / "reference.npz")
    sessions = _sessions(written)
    meta = json.loads((written / META_FILE).read_text(encoding="utf-8"))
    scale = np.abs(reference["decoded"]).max()  # random weights: the audio is tiny, so compare relatively

    whole = _decode_full(sessions["decode_full"], reference["decode_codes"])
    assert whole.shape == reference["decoded"].shape
    assert np.abs(whole - reference["decoded"]).max() / scale < DECODE_TOLERANCE

    chunks = [int(n) for n in reference["stream_chunks"]]
    streamed, state = _stream(sessions["decode_step"], meta, reference["decode_codes"], chunks)
    assert np.abs(streamed - reference["streamed"]).max() / scale < DECODE_TOLERANCE
    _, upstream_state = _stream(
        _session(FIXTURE / meta["files"]["decode_step"]), meta, reference["decode_codes"], chunks
    )
    for name, value in upstream_state.items():
        if value.dtype == np.int32:  # offsets and cached positions
            np.testing.assert_array_equal(state[name], value, err_msg=name)
        else:
            assert np.abs(state[name] - value).max() <= STATE_TOLERANCE * np.abs(value).max(), name

    waveform = reference["waveform"]
    codes, lengths = sessions["encode"].run(
        None, {"waveform": waveform.T[None].copy(), "input_lengths": np.array([len(waveform)], np.int32)}
    )
    assert int(lengths[0]) == len(reference["codes"])
    np.testing.assert_array_equal(codes[0], reference["codes"])  # nearest-code choices: exactly PyTorch's


def _codec_outputs(directory: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """What the package's runtime reader (NanoOnnxCodec) makes of ``directory``: the codes of the reference
    waveform, the whole decode of its codes and their stream in PyTorch's chunks."""
    reference = np.load(FIXTURE / "reference.npz")
    codec = NanoOnnxCodec(directory, provider="cpu", threads=1)
    decoder, pieces, start = codec.stream_decoder(), [], 0
    for size in reference["stream_chunks"]:
        pieces.append(decoder.decode(reference["decode_codes"][start : start + int(size)]))
        start += int(size)
    return codec.encode(reference["waveform"]), codec.decode(reference["decode_codes"]), np.concatenate(pieces)


def _decode_error(audio: np.ndarray, expected: np.ndarray) -> float:
    return float(np.abs(audio - expected).max() / np.abs(expected).max())


def test_nano_onnx_codec_reads_the_written_graphs_as_pytorchs_codec(written: Path) -> None:
    reference = np.load(FIXTURE / "reference.npz")
    codes, whole, streamed = _codec_outputs(written)
    np.testing.assert_array_equal(codes, reference["codes"])
    assert _decode_error(whole, reference["decoded"]) < DECODE_TOLERANCE
    assert _decode_error(streamed, reference["streamed"]) < DECODE_TOLERANCE


def test_a_perturbed_weight_is_caught(tmp_path: Path) -> None:
    """The comparison above can fail: one attention weight of the decoder scaled by 1.001 (attention, where
    upstream's layer scale of 0.01 hides the most) moves the audio past the tolerance (measured 5.1e-6)."""
    checkpoint = SafetensorsCheckpoint(FIXTURE)
    tensors = {name: checkpoint.read(name) for name in checkpoint.tensors}
    tensors["decoder.1.transformer.layers.0.self_attn.in_proj.weight"] *= 1.001
    source = tmp_path / "perturbed"
    source.mkdir()
    shutil.copy(FIXTURE / "config.json", source / "config.json")
    write_safetensors(source / "model.safetensors", tensors, "F32")
    reference = np.load(FIXTURE / "reference.npz")
    _, whole, streamed = _codec_outputs(write_nano_codec(source, tmp_path / "codec"))
    assert _decode_error(whole, reference["decoded"]) > DECODE_TOLERANCE
    assert _decode_error(streamed, reference["streamed"]) > DECODE_TOLERANCE


def _signature(session: Any) -> list[tuple[str, str, list[Any]]]:
    return [(v.name, v.type, v.shape) for v in (*session.get_inputs(), *session.get_outputs())]


def _same_axes(ours: list[Any], theirs: list[Any]) -> bool:
    """Shapes agree where both are fixed; a named axis (the exporter's own name) matches any size."""
    return len(ours) == len(theirs) and all(
        a == b or isinstance(a, str) or isinstance(b, str) for a, b in zip(ours, theirs, strict=True)
    )


def test_names_shapes_and_meta_are_upstreams(written: Path) -> None:
    ours, theirs = _sessions(written), _sessions(FIXTURE)
    for role, session in ours.items():
        mine, exported = _signature(session), _signature(theirs[role])
        assert [(n, t) for n, t, _ in mine] == [(n, t) for n, t, _ in exported], role
        assert all(_same_axes(a[2], b[2]) for a, b in zip(mine, exported, strict=True)), (role, mine, exported)
    assert json.loads((written / META_FILE).read_text()) == json.loads((FIXTURE / META_FILE).read_text())


def test_decode_step_streamed_equals_decode_full(tmp_path: Path) -> None:
    # The tiny demo codec attends 1 s back (12.5 frames), so 20 frames in uneven chunks slide past every span.
    directory = write_random_nano_codec(tmp_path / "codec", "tiny", seed=3)
    sessions = _sessions(directory)
    meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    codes = np.random.default_rng(1).integers(0, 1024, (20, 16))
    whole = _decode_full(sessions["decode_full"], codes)
    streamed, _ = _stream(sessions["decode_step"], meta, codes, [1, 2, 9, 8])
    assert whole.shape == streamed.shape == (20 * 3840, 2)
    assert np.abs(streamed - whole).max() / np.abs(whole).max() < DECODE_TOLERANCE


def test_the_random_checkpoint_is_upstreams_state_dict_initialized_as_upstream(tmp_path: Path) -> None:
    """Given the fixture's config, the same tensors as upstream's model makes, with its init's scale."""
    config = json.loads((FIXTURE / "config.json").read_text(encoding="utf-8"))
    ours = SafetensorsCheckpoint(write_random_nano_checkpoint(config, tmp_path / "random"))
    upstream = SafetensorsCheckpoint(FIXTURE)
    assert {n: i.shape for n, i in ours.tensors.items()} == {n: i.shape for n, i in upstream.tensors.items()}
    for name, info in upstream.tensors.items():
        theirs, mine = upstream.read(name), ours.read(name)
        if np.all(theirs == theirs.flat[0]):  # norms, layer scales, biases: set values
            np.testing.assert_array_equal(mine, theirs, err_msg=name)
        elif info.shape[-1] != 1 or theirs.size >= 256:  # enough values for the spread to say something
            assert abs(mine.std() / theirs.std() - 1) < 0.2, name


def test_the_real_size_checkpoint_has_the_real_codecs_shape(tmp_path: Path) -> None:
    checkpoint = SafetensorsCheckpoint(write_random_nano_checkpoint(nano_config("real"), tmp_path / "real"))
    # By hand from the architecture: per Transformer layer 4 d^2 (attention) + 2 d f (FFN) + 4 d (norms) +
    # 2 d (layer scales), d 256, f 1024; 12 layers a side; the projections between the patches; 16 quantizers
    # (codebook 1024 x 8, in and out weight-normed 1x1 convolutions 512 <-> 8), input and output 768 <-> 512.
    layer = 4 * 256**2 + 2 * 256 * 1024 + 6 * 256
    side = 12 * layer + 256 * (192 + 768 + 2 * (384 + 768) + 384 + 240)  # the encoder mirrors the decoder
    level = 1024 * 8 + (8 * 512 + 8 + 8) + (512 * 8 + 512 + 512)  # codebook, in_proj (v, g, bias), out_proj
    quantizer = 16 * level + (512 * 768 + 512 + 512) + (768 * 512 + 768 + 768)
    total = sum(int(np.prod(info.shape)) for info in checkpoint.tensors.values())
    assert total == 2 * side + quantizer == 21_969_664
    assert 19_000_000 < total < 23_000_000  # "about 20 M parameters" (upstream's model card)


def test_the_real_size_decoder_keeps_the_published_streaming_state(tmp_path: Path) -> None:
    """The published decode_step's attention caches: 4 heads of 64 and, per decoder Transformer's layers,
    spans of 500 (4 layers), 800 (2), 1200 (2) and 1600 (4) positions."""
    directory = write_random_nano_codec(tmp_path / "real", "real")
    codec = NanoOnnxCodec(directory, provider="cpu", threads=1)  # the runtime takes it: names, types, sizes
    assert codec.decode(np.zeros((1, 16), np.int64)).shape == (3840, 2)
    caches = json.loads((directory / META_FILE).read_text())["streaming_decode"]["attention_caches"]
    assert [c["context"] for c in caches] == [500] * 4 + [800] * 2 + [1200] * 2 + [1600] * 4
    assert all(c["cache_shape"] == [1, 4, c["context"], 64] for c in caches)
