"""Shared fixtures and helpers: one tiny random model (real file formats) per test session, the demo
codec, codec-tiny (the real codec architecture), small vocabularies, weight directories with a file left
out, the command line, a sound output to record, and for the ROS tests a node params file and loopback-only
network namespaces (ros_helpers/)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from ros_helpers import PARAMS_FILE_SEED, node_params_file
from ros_helpers.netns import LoopbackNamespace, loopback_namespace

from moss_tts_node.model.spec import ModelSpec
from moss_tts_node.tools.dev.codec_fidelity import snr_db
from moss_tts_node.tools.dev.demo_codec import write_demo_codec
from moss_tts_node.tools.dev.demo_weights import write_demo_weights

REPO_ROOT = Path(__file__).resolve().parents[1]
# The directory of shared fixtures; CI keeps a copy beside the clone (<clone>/../shared).
SHARED_DIR_VARIABLE = "MOSS_SHARED_DIR"
CODEC_TINY = "codec-tiny"
CODEC_TINY_FILES = (
    "decoder.onnx",
    "encoder.onnx",
    "reference.npz",
    "config.json",
    "model.safetensors",
    "reference16.npz",
)
# Set (to anything but "" or "0") where codec-tiny must be there: .ci/run sets it, so that in CI the tests
# that carry the codec's exactness fail with the reason instead of skipping.
REQUIRE_CODEC_TINY_VARIABLE = "MOSS_REQUIRE_CODEC_TINY"

if TYPE_CHECKING:
    from moss_tts_node.synthesizer import Synthesizer


def prompt_text(synth: Synthesizer, prompt: np.ndarray) -> str:
    """A prompt's text channel as the tokenizer writes it, special tokens included."""
    return synth.prompts.tokenizer.decode(prompt[:, 0].tolist(), skip_special_tokens=False)


@pytest.fixture(scope="session")
def demo_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """config.yaml of a freshly written demo model; treat the directory as read-only."""
    return write_demo_weights(tmp_path_factory.mktemp("demo"), seed=0)


@pytest.fixture(scope="session")
def family_demo(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """config.yaml of the demo of a model of the family (a key of ``FAMILY``: ``demo-weights --model``), written at
    its first use in the session; treat its directory as read-only."""
    written: dict[str, Path] = {}

    def demo(model: str) -> Path:
        if model not in written:
            written[model] = write_demo_weights(tmp_path_factory.mktemp(model), seed=0, model=model)
        return written[model]

    return demo


@pytest.fixture(scope="session")
def nano_demo_config(family_demo: Callable[[str], Path]) -> Path:
    """config.yaml of MOSS-TTS-Nano's demo (``demo-weights --model nano``: 48 kHz stereo); read-only."""
    return family_demo("nano")


@pytest.fixture(scope="session")
def synth(demo_config: Path) -> Iterator[Synthesizer]:
    from moss_tts_node.synthesizer import Synthesizer

    with Synthesizer.from_config_file(demo_config) as loaded:
        yield loaded


NANO_RATE = 48000  # MOSS-TTS-Nano's audio: 48 kHz stereo (docs/nano.md)
SMALL_CONTEXT_ROWS = 384  # a context that holds about 55 text tokens of speech per piece


@pytest.fixture(scope="module")
def small_context(demo_config: Path) -> Iterator[Synthesizer]:
    """The demo model with a context small enough that a few sentences are several pieces (one per module: a test
    may patch its parts)."""
    from moss_tts_node.synthesizer import Synthesizer

    with Synthesizer.from_config_file(demo_config, {"llama.n_ctx": SMALL_CONTEXT_ROWS}) as loaded:
        yield loaded


def codec_tiny_location() -> Path:
    """Where codec-tiny is looked for (whether or not it is there): ``codec_tiny_dir`` checks that it is."""
    return Path(os.environ.get(SHARED_DIR_VARIABLE) or REPO_ROOT.parent / "shared") / CODEC_TINY


def codec_tiny_or_skip() -> Path:
    """codec-tiny's directory; without it the calling test skips, or fails where MOSS_REQUIRE_CODEC_TINY is set."""
    directory = codec_tiny_location()
    missing = [name for name in CODEC_TINY_FILES if not (directory / name).is_file()]
    if missing:
        reason = (
            f"{directory} lacks {', '.join(missing)}: put the shared fixtures beside the clone "
            f"or set {SHARED_DIR_VARIABLE} to the folder that holds {CODEC_TINY}"
        )
        if os.environ.get(REQUIRE_CODEC_TINY_VARIABLE, "") not in ("", "0"):
            pytest.fail(f"{reason} ({REQUIRE_CODEC_TINY_VARIABLE} is set: here codec-tiny must be there)")
        pytest.skip(reason)
    return directory


@pytest.fixture(scope="session")
def codec_tiny_dir() -> Path:
    """codec-tiny: the real codec architecture (tiny, random) with PyTorch reference outputs; see codec_tiny_or_skip."""
    return codec_tiny_or_skip()


@pytest.fixture(scope="session")
def codec_tiny_streaming_dir(codec_tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """codec-tiny with its stream decoder graph built beside its ONNX graphs, where build-stream-decoder puts it."""
    from moss_tts_node.codec.layout import STREAM_DECODER_FILE
    from moss_tts_node.tools.prepare.stream_decoder_build import build_stream_decoder

    directory = linked_copy(codec_tiny_dir, tmp_path_factory.mktemp(CODEC_TINY))
    build_stream_decoder(codec_tiny_dir, directory / STREAM_DECODER_FILE)
    return directory


@pytest.fixture(scope="session")
def stateful_synth(demo_config: Path, codec_tiny_streaming_dir: Path) -> Iterator[Synthesizer]:
    """The demo model speaking through codec-tiny, whose stream decoder graph sits beside its ONNX graphs (a stream
    is the offline decode); treat it as read-only."""
    from moss_tts_node.synthesizer import Synthesizer

    with Synthesizer.from_config_file(demo_config, {"model.codec_dir": str(codec_tiny_streaming_dir)}) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def demo_codec(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(encoder.onnx, decoder.onnx) of the tiny demo codec; read-only."""
    return write_demo_codec(tmp_path_factory.mktemp("demo_codec"))


def small_spec(first_id: int) -> ModelSpec:
    """A ModelSpec for a small text vocabulary: the special tokens take the ids from ``first_id`` on."""
    names = (
        "pad_token_id",
        "im_start_token_id",
        "im_end_token_id",
        "audio_start_token_id",
        "audio_end_token_id",
        "audio_user_slot_token_id",
        "audio_assistant_gen_slot_token_id",
        "audio_assistant_delay_slot_token_id",
    )
    return ModelSpec(**{name: first_id + offset for offset, name in enumerate(names)})


def linked_copy(source: Path, target: Path, skip: Iterable[str | Path] = ()) -> Path:
    """``target`` filled with symlinks to every file under ``source`` except those in ``skip`` (relative
    paths): a weights directory to break one file of without touching the shared one."""
    skipped = {Path(path) for path in skip}
    for path in source.rglob("*"):
        relative = path.relative_to(source)
        if path.is_dir() or relative in skipped:
            continue
        (target / relative).parent.mkdir(parents=True, exist_ok=True)
        (target / relative).symlink_to(path)
    return target


def run_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``python -m moss_tts_node ARGS`` in a child process (it inherits PYTHONPATH), output captured."""
    return subprocess.run(
        [sys.executable, "-m", "moss_tts_node", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def bad_input_message(*args: str | Path) -> str:
    """Run the command line, which must refuse the input with exit status 2 and one ``error:`` line; that line."""
    done = run_cli(*args)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


AUDIO_DEPS = "scripts/audio_test_deps.sh"


class NullSink:
    """A private PulseAudio server whose default output is a null sink, and a recorder of what it plays.

    Processes given ``env`` play into it through PortAudio (ALSA's PulseAudio plugin). The sink runs at the
    model's rate and channels (the codec's 24 kHz mono; MOSS-TTS-Nano's 48 kHz stereo), so what was played comes
    back sample for sample (16-bit precision), channels interleaved.
    """

    NAME = "moss_test"
    RATE = 24000
    TAIL_S = 0.5

    def __init__(self, folder: Path, rate: int = RATE, channels: int = 1) -> None:
        self.rate, self.channels = rate, channels
        socket = folder / "native"
        self.env = {**os.environ, "PULSE_SERVER": f"unix:{socket}"}
        modules = [
            f"module-native-protocol-unix socket={socket} auth-anonymous=1",
            f"module-null-sink sink_name={self.NAME} rate={rate} channels={channels}",
        ]
        self._log = (folder / "pulseaudio.log").open("w")
        self._server = subprocess.Popen(
            ["pulseaudio", "-n", "--daemonize=no", "--exit-idle-time=-1", "--disallow-exit", "--use-pid-file=no"]
            + [arg for module in modules for arg in ("-L", module)],
            env={**os.environ, "HOME": str(folder), "XDG_RUNTIME_DIR": str(folder)},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 20
        while subprocess.run(["pactl", "info"], env=self.env, capture_output=True).returncode != 0:
            if self._server.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"PulseAudio did not start: {(folder / 'pulseaudio.log').read_text()[-2000:]}")
            time.sleep(0.1)

    @contextmanager
    def recording(self, path: Path) -> Iterator[list[np.ndarray]]:
        """Record the sink while the block runs; the list holds the float32 samples once it ends."""
        got: list[np.ndarray] = []
        with path.open("wb") as raw:
            recorder = subprocess.Popen(
                [
                    "parec",
                    "-d",
                    f"{self.NAME}.monitor",
                    "--raw",
                    "--format=float32le",
                    f"--rate={self.rate}",
                    f"--channels={self.channels}",
                ],
                env=self.env,
                stdout=raw,
            )
            # The idle sink's monitor streams silence: once some has arrived the recorder is connected,
            # and a player started now is recorded from its first sample (synthesis can be that fast).
            deadline = time.monotonic() + 20
            while path.stat().st_size == 0:
                if recorder.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"parec recorded nothing (exit status {recorder.poll()})")
                time.sleep(0.02)
            started = time.monotonic()
            try:
                yield got
            finally:
                # The sink plays in real time and its monitor trails it: record on until the file holds
                # TAIL_S more than the block's duration, so the last samples played are in.
                wanted = (time.monotonic() - started + self.TAIL_S) * self.rate * self.channels * 4
                deadline = time.monotonic() + 10
                while path.stat().st_size < wanted and recorder.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                recorder.send_signal(signal.SIGINT)
                recorder.wait(10)
        got.append(np.fromfile(path, dtype="<f4"))

    @staticmethod
    def wait_recorded(path: Path, samples: int, timeout: float = 60.0) -> None:
        """Wait until the recording at ``path`` (in a ``recording`` block) holds ``samples``: that much of the sink's
        own time, which plays in real time, has passed, however busy the machine is."""
        deadline = time.monotonic() + timeout
        while path.stat().st_size < samples * 4:
            assert time.monotonic() < deadline, f"recorded {path.stat().st_size // 4} of {samples} samples"
            time.sleep(0.05)

    @staticmethod
    def snr_db(reference: np.ndarray, captured: np.ndarray) -> float:
        """How well ``captured`` holds ``reference`` at one offset: the SNR in dB of the best-aligned copy.

        One offset for the whole utterance, so a gap or a lost block anywhere costs tens of dB.
        """
        size = 1 << int(np.ceil(np.log2(reference.size + captured.size)))
        spectrum = np.fft.rfft(captured, size) * np.conj(np.fft.rfft(reference, size))
        lag = int(np.argmax(np.fft.irfft(spectrum, size)[: captured.size]))
        aligned = np.zeros_like(reference)
        part = captured[lag : lag + reference.size]
        aligned[: part.size] = part
        return snr_db(aligned, reference)

    def close(self) -> None:
        if self._server.poll() is None:
            self._server.terminate()
            self._server.wait(10)
        self._log.close()


def _null_sink(folder: Path, rate: int, channels: int) -> NullSink:
    """A NullSink at ``rate`` and ``channels``; skips with the reason where the machine has no sound server."""
    missing = [tool for tool in ("pulseaudio", "pactl", "parec") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)}: `make test` installs PulseAudio as root on Debian ({AUDIO_DEPS})")
    if importlib.util.find_spec("sounddevice") is None:
        pytest.skip("sounddevice is not installed: pip install -e '.[play]' (make test does)")
    return NullSink(folder, rate, channels)


@pytest.fixture(scope="session")
def null_sink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NullSink]:
    """A sound output at 24 kHz mono to play into and record back; skips with the reason where there is none."""
    sink = _null_sink(tmp_path_factory.mktemp("pulse"), NullSink.RATE, 1)
    yield sink
    sink.close()


@pytest.fixture(scope="session")
def stereo_sink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NullSink]:
    """A sound output at MOSS-TTS-Nano's 48 kHz stereo, a PulseAudio server of its own (a default sink each)."""
    sink = _null_sink(tmp_path_factory.mktemp("pulse48"), NANO_RATE, 2)
    yield sink
    sink.close()


@pytest.fixture(scope="session")
def params_file(demo_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo config as a node params file: one llama thread, room for long requests, and a seed to find
    (``PARAMS_FILE_SEED``); read-only."""
    values = {"llama.n_threads": 1, "llama.n_ctx": 8192, "sampling.seed": PARAMS_FILE_SEED}
    return node_params_file(demo_config, tmp_path_factory.mktemp("params") / "node.yaml", **values)


@pytest.fixture(scope="module")
def netns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackNamespace]:
    """A loopback-only network namespace for a module's ROS processes (its node, its clients)."""
    ns = loopback_namespace(tmp_path_factory.mktemp("ros"))
    yield ns
    ns.close()


@pytest.fixture
def own_netns(tmp_path: Path) -> Iterator[LoopbackNamespace]:
    """A namespace of the test's own, for a node of its own: two nodes of one name in one domain would both answer."""
    ns = loopback_namespace(tmp_path / "ros")
    yield ns
    ns.close()
