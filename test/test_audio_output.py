"""The audio given out (audio_output.py): converted as it streams, the streamed conversion the whole one's.

A stream of chunks cut as the synthesizer cuts them (one frame, then ``chunk_frames``), converted chunk by chunk,
must be the whole utterance converted at once, within ``STREAM_TOLERANCE`` of its peak; resampling each chunk on
its own (what the stream must not do) is off by far more at the joins. The channels: mono from stereo is their mean,
stereo from mono a copy. The keys are refused at load with the range or the words they take, and MOSS-TTS-Nano's
synthesizer gives out what they ask for, in its streams and in its whole utterances.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
import soxr
import yaml

from moss_tts_node.audio_output import AudioFormat, converted, remix
from moss_tts_node.config import AudioConfig, load_config
from moss_tts_node.errors import ConfigError
from moss_tts_node.synthesis.results import AudioChunk
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.timing import StopReason
from moss_tts_node.tools.prepare.convert import convert_checkpoint

DATA = Path(__file__).parent / "data"
NANO = AudioFormat(48000, 2)
FRAME = 3840  # samples a channel of one Nano frame (80 ms at 48 kHz)
CHUNK = 5 * FRAME  # audio.chunk_frames' default
# soxr's stream is its whole conversion to the bit here (measured: 0.0); the bound leaves room for another build's
# float rounding. A per-chunk resample is off by about 3.5e-2 of the peak at the joins (the test checks > 1e-3).
STREAM_TOLERANCE = 1e-6
NAIVE_ERROR = 1e-3


def sweep(seconds: float = 2.0, rate: int = 48000) -> np.ndarray:
    """(n, 2) float32: a rising sweep on the left, a steady tone on the right (a join's click shows on either)."""
    t = np.arange(round(seconds * rate)) / rate
    return np.stack([0.5 * np.sin(2 * np.pi * 440 * t * (1 + t)), 0.3 * np.sin(2 * np.pi * 1000 * t)], axis=1).astype(
        np.float32
    )


def cuts(samples: int) -> list[tuple[int, int]]:
    """Where the synthesizer cuts an utterance: one frame, then chunks of ``CHUNK``."""
    edges = [0, FRAME, *range(FRAME + CHUNK, samples, CHUNK), samples]
    return list(pairwise(edges))


def stream_of(audio: np.ndarray, rate: int) -> Generator[AudioChunk, None, str]:
    spans = cuts(audio.shape[0])
    for index, (start, end) in enumerate(spans):
        final = StopReason.END if index == len(spans) - 1 else None
        yield AudioChunk(audio[start:end], rate, index, start / rate, final)
    return "the result"


def read(stream: Generator[AudioChunk, None, str]) -> tuple[list[AudioChunk], str]:
    chunks: list[AudioChunk] = []
    while True:
        try:
            chunks.append(next(stream))
        except StopIteration as end:
            return chunks, end.value


@pytest.mark.parametrize(
    ("target", "whole"),
    [
        (AudioFormat(24000, 1), lambda x: soxr.resample(x.mean(axis=1), 48000, 24000)),
        (AudioFormat(44100, 2), lambda x: soxr.resample(x, 48000, 44100)),
        (AudioFormat(16000, 1), lambda x: soxr.resample(x.mean(axis=1), 48000, 16000)),
    ],
    ids=["24k-mono", "44k1-stereo", "16k-mono"],
)
def test_a_streamed_conversion_is_the_whole_one_and_a_per_chunk_one_is_not(target: AudioFormat, whole) -> None:
    audio = sweep()
    expected = whole(audio).astype(np.float32)
    chunks, result = read(converted(stream_of(audio, NANO.sample_rate), NANO, target))
    assert result == "the result"  # the stream's own result comes through
    assert [c.index for c in chunks] == list(range(len(cuts(audio.shape[0]))))
    assert chunks[-1].stop_reason is StopReason.END and all(c.stop_reason is None for c in chunks[:-1])
    assert all(c.sample_rate == target.sample_rate for c in chunks)
    starts = np.cumsum([0] + [c.samples.shape[0] for c in chunks[:-1]]) / target.sample_rate
    np.testing.assert_allclose([c.start_s for c in chunks], starts)  # each starts where the one before ended
    streamed = np.concatenate([c.samples for c in chunks])
    assert streamed.shape == expected.shape and streamed.dtype == np.float32
    peak = np.abs(expected).max()
    assert np.abs(streamed - expected).max() <= STREAM_TOLERANCE * peak
    channels = audio.mean(axis=1) if target.channels == 1 else audio
    naive = np.concatenate([soxr.resample(channels[a:b], 48000, target.sample_rate) for a, b in cuts(len(audio))])
    assert np.abs(naive[: len(expected)] - expected[: len(naive)]).max() > NAIVE_ERROR * peak


def test_channels_mono_is_their_mean_and_stereo_a_copy() -> None:
    stereo = sweep(0.1)
    np.testing.assert_array_equal(remix(stereo, 1), (stereo[:, 0] + stereo[:, 1]) / 2)
    mono = stereo[:, 0]
    np.testing.assert_array_equal(remix(mono, 2), np.stack([mono, mono], axis=1))
    assert remix(stereo, 2) is stereo
    chunks, _ = read(converted(stream_of(mono, 24000), AudioFormat(24000, 1), AudioFormat(24000, 2)))
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), np.stack([mono, mono], axis=1))


def test_the_models_own_format_passes_untouched() -> None:
    stream = stream_of(sweep(0.2), 48000)
    assert converted(stream, NANO, NANO) is stream
    assert NANO.given_out(AudioConfig()) == NANO


def test_closing_the_converted_stream_closes_the_synthesis() -> None:
    closed: list[bool] = []

    def synthesis() -> Iterator[AudioChunk]:
        try:
            yield from stream_of(sweep(1.0), 48000)
        finally:
            closed.append(True)

    stream = converted(synthesis(), NANO, AudioFormat(24000, 1))  # type: ignore[arg-type]
    next(stream)
    stream.close()
    assert closed == [True]


def _params(path: Path, **audio: object) -> Path:
    path.write_text(yaml.safe_dump({"moss_tts_node": {"ros__parameters": {"audio": audio}}}), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("audio", "message"),
    [
        ({"output_sample_rate": 4000}, r"'audio\.output_sample_rate' must be >= 8000 \(or 0 for the model's rate\)"),
        ({"output_sample_rate": 384000}, r"'audio\.output_sample_rate' must be <= 192000"),
        ({"output_sample_rate": 24000.0}, r"'audio\.output_sample_rate' must be int"),
        ({"output_channels": "surround"}, r"'audio\.output_channels' must be one of model, mono, stereo"),
        ({"output_channels": 2}, r"'audio\.output_channels' must be str"),
    ],
)
def test_output_keys_are_checked_at_load(tmp_path: Path, audio: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(_params(tmp_path / "c.yaml", **audio))


def test_output_keys_are_refused_with_the_remote_backend(tmp_path: Path) -> None:
    params = {
        "model": {"backend": "remote", "remote_url": "http://server:8000/v1"},
        "audio": {"output_channels": "mono"},
    }
    path = tmp_path / "remote.yaml"
    path.write_text(yaml.safe_dump({"moss_tts_node": {"ros__parameters": params}}), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"with model\.backend remote the audio is the server's 24 kHz mono PCM"):
        load_config(path)


# -- MOSS-TTS-Nano through the synthesizer ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def nano_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """test/data/nano-tiny converted, with upstream's tiny codec, greedy: a params file."""
    gguf = convert_checkpoint(DATA / "nano-tiny", tmp_path_factory.mktemp("nano"), "F32")
    params = {
        "model": {
            "weights_dir": str(gguf.parent),
            "backbone_gguf": gguf.name,
            "codec_dir": str(DATA / "nano-codec-tiny"),
        },
        "sampling": {"text_temperature": 0.0, "audio_temperature": 0.0},
    }
    path = tmp_path_factory.mktemp("cfg") / "nano.yaml"
    path.write_text(yaml.safe_dump({"moss_tts_node": {"ros__parameters": params}}), encoding="utf-8")
    return path


TEXT = "Hello there, robot."


def test_nano_gives_out_its_own_48_khz_stereo_by_default(nano_config: Path) -> None:
    with Synthesizer.from_config_file(nano_config) as synth:
        assert (synth.sampling_rate, synth.channels) == (48000, 2)
        result = synth.synthesize(TEXT)
    assert result.sample_rate == 48000 and result.audio.ndim == 2 and result.audio.shape[1] == 2


def test_nano_converted_streams_as_its_whole_utterance_converted_once(nano_config: Path) -> None:
    with Synthesizer.from_config_file(nano_config) as synth:
        native = synth.synthesize(TEXT).audio
    overrides = {"audio.output_sample_rate": 24000, "audio.output_channels": "mono"}
    with Synthesizer.from_config_file(nano_config, overrides) as synth:
        assert (synth.sampling_rate, synth.channels) == (24000, 1)
        chunks = list(synth.stream(TEXT))
        whole = synth.synthesize(TEXT)
    expected = soxr.resample(native.mean(axis=1), 48000, 24000)
    streamed = np.concatenate([c.samples for c in chunks])
    assert len(chunks) > 1 and all(c.sample_rate == 24000 for c in chunks) and chunks[-1].is_final
    # The stream decoder gives the whole decode within 3.5e-7 of the peak (docs/nano.md, "The codec"): the
    # conversion keeps that, as the stream of chunks is converted as one signal.
    peak = np.abs(expected).max()
    assert streamed.shape == expected.shape
    assert np.abs(streamed - expected).max() <= 1e-5 * peak
    assert whole.sample_rate == 24000 and whole.audio.shape == expected.shape
    assert np.abs(whole.audio - expected).max() <= 1e-5 * peak


def test_nano_clones_a_voice_from_a_clip_of_another_rate_and_channels(nano_config: Path, tmp_path: Path) -> None:
    """A 44.1 kHz stereo clip and a 16 kHz mono one are converted to the codec's 48 kHz stereo, as upstream does."""
    from moss_tts_node.codec.audio_io import write_wav

    stereo, mono = tmp_path / "stereo.wav", tmp_path / "mono.wav"
    write_wav(stereo, sweep(1.0, 44100), 44100)
    write_wav(mono, sweep(1.0, 16000)[:, 0], 16000)
    with Synthesizer.from_config_file(nano_config) as synth:
        for clip in (stereo, mono):
            assert synth.encode_reference(clip).shape == (12, 16)  # 1 s, the partial frame dropped


def test_nano_text_in_fragments_is_given_out_converted_too(nano_config: Path) -> None:
    overrides = {"audio.output_sample_rate": 24000, "audio.output_channels": "mono"}
    with Synthesizer.from_config_file(nano_config, overrides) as synth:
        chunks = list(synth.stream_text(["Hello ", "there, ", "robot."]))
    assert chunks and chunks[-1].is_final
    assert all(c.sample_rate == 24000 and c.samples.ndim == 1 for c in chunks)
