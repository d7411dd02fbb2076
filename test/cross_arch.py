"""The numbers of the aarch64 check (scripts/aarch64_check.sh): the same GGUF decoded on two machines, and the same
demo synthesis, compared.

    python cross_arch.py write DIR                  # one real-width layer as F32, F16, Q8_0, Q4_0, Q4_K_M + rows
    python cross_arch.py decode DIR OUT [--types T...]  # each GGUF's last hidden state (backbone_worker.py) into OUT
    python cross_arch.py speak DEMO OUT --text T --codes X86/tokens.npz  # the F32 demo, the codec on x86's codes
    python cross_arch.py compare REF OTHER...       # OTHER's hidden states and demo against REF's; exit 1 if off

DIR is written once (on x86-64) and read by every machine, so all decode the very same files. OUT (and REF, OTHER)
is a folder holding ``hidden.npz`` and ``system_info.json``, ``demo_weights/`` and ``tokens.npz`` (``make demo``'s
synthesis, ``synth --seed 1 --save-tokens``), and what ``speak`` writes.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from qwen3_reference import qwen3_forward
from test_weight_placement import REAL_WIDTH, run_worker

from moss_tts_node.llama.bindings import Status, llama_system_info, load_bridge_library, status_error
from moss_tts_node.tools.prepare.conversion import GGUF_TYPES
from moss_tts_node.tools.prepare.qwen3_gguf import random_qwen3_tensors, write_qwen3_gguf

TENSOR_SEED, ROWS_SEED, ROWS = 3, 4, 12  # test_weight_placement.py's real_width fixture
ROWS_FILE = "rows.npy"
HIDDEN_FILE = "hidden.npz"
INFO_FILE = "system_info.json"
DEMO_DIR, DEMO_TOKENS = "demo_weights", "tokens.npz"
F32_TOKENS, CODEC_FILE = "f32_tokens.npz", "codec.npy"
# The demo codec's float output for the same codes: ONNX Runtime's kernels differ (MLAS's NEON against AVX2/AVX-512)
# but compute the same float32 graph; relative to the waveform's peak.
CODEC_TOLERANCE = 1e-4
# Q4_0 is no converter output (llama.cpp's own files use it), but it is the type Arm's repacked layouts were made
# for (4x4 with dotprod, 4x8 with i8mm, 8x8 with 256-bit SVE): llama.h's LLAMA_FTYPE_MOSTLY_Q4_0.
Q4_0_FTYPE = 2


@dataclass(frozen=True)
class Tolerance:
    """How far another machine's hidden state may be from x86-64's, relative to x86-64's own error.

    ``share`` bounds ||other - x86|| by that fraction of ||x86 - float64 reference||: the two machines run different
    kernels (NEON/SVE/i8mm, Arm's repacked layouts, fp16 arithmetic on Arm, AVX2 on x86), so they round
    differently, but the difference between them must stay small next to the rounding both do. ``floor`` is an
    absolute floor (relative norm) for F32, whose own error is at float32's noise.
    """

    share: float
    floor: float = 0.0


# Why each: F32 and the integer-dot types (Q8_0, Q4_0, Q4_K_M: both machines quantize the activations to 8 bits
# and sum exact integer products; only float scales' order differs, and an activation rounding to the other side
# here and there, as Q4_0's differently interleaved layouts do) agree far below their quantization error. F16: an
# Arm CPU with fp16 vector arithmetic (system_info's FP16_VA, an Orin's) multiplies and accumulates in half
# precision (ggml's NEON GGML_F16x8_FMA is vfmaq_f16, and llamafile's tinyBLAS does the same) where x86-64 converts
# to float32: its error is its own, a few times half precision's 2^-10 over these 2048- and 6144-long dot
# products (measured 2026-12-03: 1.5e-3, x86-64's 1.8e-4), so it is bounded absolutely.
TOLERANCES = {
    "F32": Tolerance(share=0.5, floor=1e-5),
    "F16": Tolerance(share=2.0, floor=5e-3),
    "Q8_0": Tolerance(share=0.1),
    "Q4_0": Tolerance(share=0.1),
    "Q4_K_M": Tolerance(share=0.1),
}


def write(directory: Path) -> None:
    """The real-width layer (test_weight_placement.REAL_WIDTH) in every type of TOLERANCES, and the input rows."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = random_qwen3_tensors(REAL_WIDTH, seed=TENSOR_SEED)
    for dtype in ("F32", "F16"):
        write_qwen3_gguf(directory / f"{dtype}.gguf", REAL_WIDTH, tensors.items(), dtype=dtype.lower())
    lib = load_bridge_library()
    for name in ("Q8_0", "Q4_0", "Q4_K_M"):
        ftype = Q4_0_FTYPE if name == "Q4_0" else GGUF_TYPES[name].ftype
        status = lib.moss_bridge_quantize(
            str(directory / "F16.gguf").encode(), str(directory / f"{name}.gguf").encode(), ftype, 2
        )
        if status != Status.OK:
            raise SystemExit(status_error(lib, status, None))
    rows = np.random.default_rng(ROWS_SEED).standard_normal((ROWS, REAL_WIDTH.hidden)).astype(np.float32)
    np.save(directory / ROWS_FILE, rows)


def decode(directory: Path, out: Path, types: list[str]) -> None:
    """Each GGUF's last hidden state, decoded in a process of its own (a kernel's crash names the type)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = np.load(directory / ROWS_FILE)
    hidden, layouts = {}, {}
    for name in types:
        report, hidden[name] = run_worker(directory / f"{name}.gguf", rows, out)
        layouts[name] = report["weight_layout"]
        print(f"{name}: {report['weight_layout']}", flush=True)
    np.savez(out / HIDDEN_FILE, **hidden)
    info = {"system_info": llama_system_info(), "offered": report["offered"], "weight_layout": layouts}
    (out / INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")
    print(f"system_info: {info['system_info']}")


def speak(demo: Path, out: Path, text: str, reference_codes: Path | None) -> None:
    """The demo's synthesis with an F32 backbone (converted here from its checkpoint) and an F32 KV cache, seed 1:
    its tokens into OUT/f32_tokens.npz. With ``reference_codes`` (another machine's tokens.npz), also the demo
    codec's offline decode of those very codes into OUT/codec.npy, the float output ONNX Runtime gives here."""
    from moss_tts_node.codec.factory import open_codec
    from moss_tts_node.synthesis.stages import codec_params
    from moss_tts_node.synthesizer import Synthesizer
    from moss_tts_node.tools.dev.demo_weights import CHECKPOINT_DIR
    from moss_tts_node.tools.prepare.convert import convert_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    gguf = convert_checkpoint(demo / CHECKPOINT_DIR, out / "f32_weights", "F32", force=True)
    settings = {
        "model.weights_dir": str(gguf.parent),
        "model.backbone_gguf": gguf.name,
        "model.codec_dir": str(demo / "codec"),
        "llama.kv_cache_type_k": "f32",
        "llama.kv_cache_type_v": "f32",
    }
    with Synthesizer.from_config_file(demo / "config.yaml", settings) as synth:
        stream = synth.stream(text, seed=1)
        for _ in stream:
            pass
        np.savez(out / F32_TOKENS, prompt=stream.prompt, generated=stream.generated, codes=stream.codes)
        params = replace(codec_params(synth.config, synth.spec), onnx_provider="cpu")
    if reference_codes is not None:
        codec = open_codec(params, encoder=False)
        try:
            np.save(out / CODEC_FILE, codec.decode(np.load(reference_codes)["codes"]))
        finally:
            codec.close()


def _relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / np.linalg.norm(b))


def references() -> dict[str, np.ndarray]:
    """The float64 forward of the weights each type was made from: F32's own, and the F16-rounded ones (the
    quantized files are quantized from F16.gguf)."""
    tensors = random_qwen3_tensors(REAL_WIDTH, seed=TENSOR_SEED)
    rounded = {k: (v.astype(np.float16).astype(np.float32) if v.ndim == 2 else v) for k, v in tensors.items()}
    rows = np.random.default_rng(ROWS_SEED).standard_normal((ROWS, REAL_WIDTH.hidden)).astype(np.float32)
    ref32, _ = qwen3_forward(tensors, REAL_WIDTH, rows)
    ref16, _ = qwen3_forward(rounded, REAL_WIDTH, rows)
    return {name: (ref32 if name == "F32" else ref16)[-1] for name in TOLERANCES}


def compare_hidden(reference: Path, other: Path, expected: dict[str, np.ndarray]) -> list[str]:
    """One line per type OTHER decoded; a line starting with FAIL is out of tolerance."""
    ref, got = np.load(reference / HIDDEN_FILE), np.load(other / HIDDEN_FILE)
    lines = []
    for name in got.files:
        tolerance = TOLERANCES[name]
        own, theirs = _relative(ref[name], expected[name]), _relative(got[name], expected[name])
        between = _relative(got[name], ref[name])
        limit = max(tolerance.share * own, tolerance.floor)
        verdict = "ok  " if between <= limit else "FAIL"
        lines.append(
            f"{verdict} {name:6} |x86-ref| {own:.2e}  |this-ref| {theirs:.2e}  |this-x86| {between:.2e}"
            f" (limit {limit:.2e})  max abs {np.max(np.abs(got[name] - ref[name])):.2e}"
        )
    return lines


def _onnx_ulps(a: Path, b: Path) -> int | None:
    """The most float32 ulps two ONNX graphs' initializers differ by; None if they differ otherwise."""
    import onnx
    from onnx import numpy_helper

    first, second = onnx.load(a), onnx.load(b)
    left = {t.name: numpy_helper.to_array(t) for t in first.graph.initializer}
    right = {t.name: numpy_helper.to_array(t) for t in second.graph.initializer}
    if left.keys() != right.keys() or any(left[k].shape != right[k].shape for k in left):
        return None
    del first.graph.initializer[:], second.graph.initializer[:]
    if first.SerializeToString() != second.SerializeToString():
        return None
    worst = 0
    for name, x in left.items():
        y = right[name]
        if x.dtype != np.float32:
            if not np.array_equal(x, y):
                return None
            continue
        steps = np.abs(x.view(np.int32).astype(np.int64) - y.view(np.int32).astype(np.int64))
        worst = max(worst, int(steps.max(initial=0)))
    return worst


def _same_tokens(reference: Path, other: Path) -> tuple[bool, str]:
    ref, got = np.load(reference), np.load(other)
    for key in ref.files:
        if ref[key].shape != got[key].shape or not np.array_equal(ref[key], got[key]):
            rows = np.flatnonzero((ref[key] != got[key]).any(axis=1)) if ref[key].shape == got[key].shape else [0]
            return False, f"{key} differs from its row {rows[0]} on"
    return True, "prompt, generated and codes identical"


def compare_demo(reference: Path, other: Path) -> list[str]:
    """The demo: its weights made here, its tokens at F16 (make demo's) and at F32, the codec's float output."""
    if not (other / DEMO_TOKENS).is_file():
        return []
    lines = []
    # demo-weights draws its model with NumPy's generators, the same bytes everywhere; the stream decoder graph is
    # computed with NumPy's float32 functions, whose SIMD versions may round differently (1 ulp).
    files = sorted(p.relative_to(reference / DEMO_DIR) for p in (reference / DEMO_DIR).rglob("*") if p.is_file())
    for name in files:
        mine, theirs = reference / DEMO_DIR / name, other / DEMO_DIR / name
        if theirs.is_file() and filecmp.cmp(mine, theirs, shallow=False):
            continue
        ulps = _onnx_ulps(mine, theirs) if name.suffix == ".onnx" and theirs.is_file() else None
        verdict = "ok  " if ulps is not None and ulps <= 1 else "FAIL"
        lines.append(f"{verdict} demo weights: {name} differs" + ("" if ulps is None else f" by {ulps} float32 ulp"))
    lines.append(f"ok   demo weights: {len(files)} files, the others byte-identical")
    # make demo's F16 backbone: on an Arm CPU with FP16_VA half precision sums (see TOLERANCES) move the logits
    # enough for a sampled token to differ, and the sequences part from there; said, not failed.
    same, how = _same_tokens(reference / DEMO_TOKENS, other / DEMO_TOKENS)
    lines.append(f"info demo (F16 backbone) tokens: {how}")
    # F32 backbone and KV cache: the arithmetic agrees to float32 noise, so the sampled tokens must too.
    same, how = _same_tokens(reference / F32_TOKENS, other / F32_TOKENS)
    lines.append(f"{'ok  ' if same else 'FAIL'} demo (F32 backbone) tokens: {how}")
    ref_audio, audio = np.load(reference / CODEC_FILE), np.load(other / CODEC_FILE)
    error = float(np.max(np.abs(audio - ref_audio)) / np.max(np.abs(ref_audio)))
    verdict = "ok  " if audio.shape == ref_audio.shape and error <= CODEC_TOLERANCE else "FAIL"
    lines.append(f"{verdict} demo codec, same codes: {audio.shape[0]} samples, max diff {error:.2e} of the peak")
    return lines


def compare(reference: Path, others: list[Path]) -> bool:
    expected = references()
    fine = True
    for other in others:
        info = json.loads((other / INFO_FILE).read_text())
        print(f"== {other.name}: {info['system_info']}")
        for name, layout in info["weight_layout"].items():
            print(f"     {name}: {layout}")
        lines = compare_hidden(reference, other, expected) + compare_demo(reference, other)
        print("\n".join(lines))
        fine = fine and not any(line.startswith("FAIL") for line in lines)
    return fine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("write").add_argument("directory", type=Path)
    speaking = commands.add_parser("speak")
    speaking.add_argument("demo", type=Path)
    speaking.add_argument("out", type=Path)
    speaking.add_argument("--text", required=True)
    speaking.add_argument("--codes", type=Path, help="a tokens.npz (x86-64's) whose codes to decode here")
    decoding = commands.add_parser("decode")
    decoding.add_argument("directory", type=Path)
    decoding.add_argument("out", type=Path)
    decoding.add_argument("--types", nargs="+", choices=list(TOLERANCES), default=list(TOLERANCES))
    comparing = commands.add_parser("compare")
    comparing.add_argument("reference", type=Path)
    comparing.add_argument("others", type=Path, nargs="+")
    args = parser.parse_args()
    if args.command == "write":
        write(args.directory)
    elif args.command == "speak":
        speak(args.demo, args.out, args.text, args.codes)
    elif args.command == "decode":
        decode(args.directory, args.out, args.types)
    else:
        sys.exit(0 if compare(args.reference, args.others) else 1)


if __name__ == "__main__":
    main()
