"""Decoding ahead (synthesis/decodes.py) and the thread allotment that goes with it (synthesis/stages.py).

The codec calls run on a worker thread while the caller goes on: their samples must come back in the order the
calls were taken, whatever each call's duration; an error must reach the caller; leaving must leave no call
running. Through the Synthesizer, on a Delay model (both streaming schemes) and on MOSS-TTS-Nano, a stream must
be the inline one chunk for chunk with the codec slowed at random (so that the worker and the generation meet at
many points), through pauses and pieces, cancelled, failing, and request after request.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from moss_tts_node.codec.streaming import SegmentDecoding, StatefulStreamDecoding, WindowedStreamDecoding
from moss_tts_node.config import Config, write_params_file
from moss_tts_node.errors import CodecError
from moss_tts_node.synthesis.decodes import PENDING_CHUNKS, AheadDecodes, CodecCall, InlineDecodes
from moss_tts_node.synthesis.stages import with_allotted_threads
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.timing import StageClock
from moss_tts_node.tools.prepare.convert import convert_checkpoint

DATA = Path(__file__).parent / "data"
TEXT = "Hello! I am a robot. [pause 0.3s] And I speak in pieces."
# Both synthesizers of a comparison run every stage on one thread, so that only where the codec runs differs.
ONE_THREAD = {"llama.n_threads": 1, "audio.codec_threads": 1, "generation.pause_markers": "silence"}


def _call(number: int, seconds: float, log: list[int] | None = None) -> CodecCall:
    def call() -> np.ndarray | None:
        time.sleep(seconds)
        if log is not None:
            log.append(number)
        return None if number % 3 == 0 else np.full(2, number, dtype=np.float32)

    return call


def _numbers(samples: list[np.ndarray]) -> list[int]:
    return [int(block[0]) for block in samples]


@pytest.mark.parametrize("seed", range(20))
def test_samples_come_back_in_call_order_whatever_each_call_takes(seed: int) -> None:
    rng = random.Random(seed)
    clock = StageClock()
    collected: list[np.ndarray] = []
    with AheadDecodes(clock, chunk_frames=rng.randint(1, 4)) as decodes:
        for number in range(1, 40):
            collected += decodes.run(_call(number, rng.choice([0, 0, 0.0005, 0.002])), wait=rng.random() < 0.1)
            time.sleep(rng.choice([0, 0.001]))
        earlier, last = decodes.finish(_call(40, 0))
    expected = [number for number in range(1, 40) if number % 3]
    assert last is not None and last[0] == 40
    collected += earlier
    assert _numbers(collected) == expected
    assert len(clock.calls["codec"]) == 40  # each call timed once, on the worker


def test_inline_decodes_are_the_same_calls_run_at_once() -> None:
    clock = StageClock()
    decodes = InlineDecodes(clock)
    collected = [block for number in range(1, 10) for block in decodes.run(_call(number, 0))]
    assert _numbers(collected) == [n for n in range(1, 10) if n % 3]
    earlier, last = decodes.finish(_call(10, 0))
    assert earlier == [] and last is not None and last[0] == 10


def test_wait_returns_only_after_every_call_taken() -> None:
    with AheadDecodes(StageClock(), chunk_frames=5) as decodes:
        assert decodes.run(_call(1, 0.05)) == []  # still running: the caller goes on
        assert _numbers(decodes.run(_call(2, 0.01), wait=True)) == [1, 2]


def test_the_caller_waits_once_the_codec_falls_too_far_behind() -> None:
    chunk_frames = 2
    limit = PENDING_CHUNKS * chunk_frames + 1
    release = threading.Event()
    with AheadDecodes(StageClock(), chunk_frames) as decodes:
        decodes.run(lambda: (release.wait(), np.ones(1, np.float32))[1])
        for number in range(1, limit):
            assert decodes.run(_call(number, 0)) == []
        threading.Timer(0.05, release.set).start()
        ready = decodes.run(_call(limit, 0))  # one call too many: waits for the first, which waits for release
        assert release.is_set() and len(ready) >= 1


def test_an_error_of_a_call_reaches_the_caller_and_nothing_runs_after_leaving() -> None:
    ran: list[int] = []

    def failing() -> np.ndarray:
        raise RuntimeError("codec failed")

    with pytest.raises(RuntimeError, match="codec failed"), AheadDecodes(StageClock(), chunk_frames=1) as decodes:
        decodes.run(failing)
        for number in range(1, 50):
            decodes.run(_call(number, 0.002, ran))
    after = len(ran)
    time.sleep(0.05)
    assert len(ran) == after < 49  # the queued calls were dropped, none ran once the block was left


def test_leaving_waits_for_the_running_call() -> None:
    done = threading.Event()
    with AheadDecodes(StageClock(), chunk_frames=1) as decodes:
        decodes.run(lambda: (time.sleep(0.05), done.set(), None)[2])
    assert done.is_set()


def _config(n_threads: int = 0, codec_threads: int = 0, decode_ahead: bool = True, low_memory: bool = False) -> Config:
    config = Config()
    return replace(
        config,
        model=replace(config.model, low_memory=low_memory),
        llama=replace(config.llama, n_threads=n_threads),
        audio=replace(config.audio, codec_threads=codec_threads, decode_ahead=decode_ahead),
    )


@pytest.mark.parametrize(
    ("cores", "given", "allotted"),
    [
        (2, (0, 0), (1, 1)),
        (4, (0, 0), (3, 1)),
        (8, (0, 0), (6, 2)),
        (12, (0, 0), (9, 3)),
        (1, (0, 0), (1, 1)),
        (8, (3, 0), (3, 5)),  # each zero takes what the other's count leaves
        (8, (0, 4), (4, 4)),
        (2, (0, 4), (1, 4)),  # at least one
        (8, (2, 2), (2, 2)),  # the owner's counts stand
    ],
)
def test_the_cores_are_shared_out_where_the_codec_decodes_ahead(
    cores: int, given: tuple[int, int], allotted: tuple[int, int]
) -> None:
    config = with_allotted_threads(_config(*given), cores)
    assert (config.llama.n_threads, config.audio.codec_threads) == allotted
    assert config.llama.n_threads_batch == sum(allotted)  # a prefill has no audio to decode beside it: both shares


def test_a_prefill_thread_count_given_stands() -> None:
    config = _config()
    given = replace(config, llama=replace(config.llama, n_threads_batch=3))
    assert with_allotted_threads(given, 8).llama.n_threads_batch == 3


@pytest.mark.parametrize("config", [_config(decode_ahead=False), _config(low_memory=True)])
def test_without_decoding_ahead_the_zeros_stay(config: Config) -> None:
    assert with_allotted_threads(config, 8) == config


def _jittered(monkeypatch: pytest.MonkeyPatch, decoding: type[SegmentDecoding], seed: int) -> None:
    """Each decode of ``decoding`` waits 0-4 ms first, at random."""
    rng = random.Random(seed)
    decode = decoding.decode

    def slowed(self: SegmentDecoding, segment: list[np.ndarray], start: int) -> np.ndarray:
        time.sleep(rng.choice([0, 0, 0.001, 0.004]))
        return decode(self, segment, start)

    monkeypatch.setattr(decoding, "decode", slowed)


def _assert_same_chunks(ahead: list, inline: list) -> None:
    assert [(c.index, c.start_s, c.stop_reason) for c in ahead] == [(c.index, c.start_s, c.stop_reason) for c in inline]
    for mine, theirs in zip(ahead, inline, strict=True):
        np.testing.assert_array_equal(mine.samples, theirs.samples)


def _pair(config: Path, overrides: dict[str, object]) -> Iterator[tuple[Synthesizer, Synthesizer]]:
    settings = {**ONE_THREAD, **overrides}
    with (
        Synthesizer.from_config_file(config, {**settings, "audio.decode_ahead": True}) as ahead,
        Synthesizer.from_config_file(config, {**settings, "audio.decode_ahead": False}) as inline,
    ):
        yield ahead, inline


@pytest.fixture(scope="module")
def nano_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MOSS-TTS-Nano: upstream's tiny model (converted) and tiny codec, streamed by its decode-step graph."""
    gguf = convert_checkpoint(DATA / "nano-tiny", tmp_path_factory.mktemp("nano"), "F32")
    config = gguf.parent / "config.yaml"
    codec = DATA / "nano-codec-tiny"
    write_params_file(
        config, {"model.weights_dir": ".", "model.backbone_gguf": gguf.name, "model.codec_dir": str(codec)}
    )
    return config


@pytest.fixture(scope="module", params=["delay stream decoder", "delay windows", "nano"])
def pair(
    request: pytest.FixtureRequest, demo_config: Path, codec_tiny_streaming_dir: Path, nano_config: Path
) -> Iterator[tuple[Synthesizer, Synthesizer]]:
    """(decoding ahead, inline) on the demo Delay model over codec-tiny, streamed by its stream decoder graph or by
    re-decoded windows, and on Nano."""
    if request.param == "nano":
        yield from _pair(nano_config, {"sampling.text_temperature": 0.0})  # the tiny model speaks on, greedily
        return
    scheme = {"audio.stream_decoder": "auto" if request.param == "delay stream decoder" else "off"}
    yield from _pair(demo_config, {"model.codec_dir": str(codec_tiny_streaming_dir), **scheme})


def _decoding_class(synth: Synthesizer) -> type[SegmentDecoding]:
    return StatefulStreamDecoding if synth.stages.stream_decoding is not None else WindowedStreamDecoding


def test_a_stream_decoded_ahead_is_the_inline_stream_chunk_for_chunk(
    pair: tuple[Synthesizer, Synthesizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    ahead, inline = pair
    expected = list(inline.stream(TEXT, seed=7, max_new_tokens=120))
    assert len(expected) > 3 and expected[-1].is_final
    for seed in range(4):
        with monkeypatch.context() as patch:
            _jittered(patch, _decoding_class(ahead), seed)
            _assert_same_chunks(list(ahead.stream(TEXT, seed=7, max_new_tokens=120)), expected)
    assert ahead.config.audio.decode_ahead and not inline.config.audio.decode_ahead


def test_a_cancel_while_the_codec_runs_leaves_the_next_request_as_a_fresh_one(
    pair: tuple[Synthesizer, Synthesizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    ahead, inline = pair
    expected = list(inline.stream(TEXT, seed=3, max_new_tokens=60))
    for seed in range(3):
        cancel = threading.Event()
        with monkeypatch.context() as patch:
            _jittered(patch, _decoding_class(ahead), seed)
            stream = ahead.stream(TEXT, seed=3, max_new_tokens=60, cancel=cancel)
            chunks = iter(stream)
            next(chunks)
            cancel.set()
            rest = list(chunks)
        assert stream.cancelled and not any(chunk.is_final for chunk in rest)
        _assert_same_chunks(list(ahead.stream(TEXT, seed=3, max_new_tokens=60)), expected)


def test_a_codec_error_on_the_worker_reaches_the_stream_and_the_next_request_is_whole(
    pair: tuple[Synthesizer, Synthesizer], monkeypatch: pytest.MonkeyPatch
) -> None:
    ahead, inline = pair
    decoding = _decoding_class(ahead)
    decode, calls = decoding.decode, []

    def failing(self: SegmentDecoding, segment: list[np.ndarray], start: int) -> np.ndarray:
        calls.append(threading.current_thread().name)
        if len(calls) == 3:
            raise CodecError("the codec failed")
        return decode(self, segment, start)

    with monkeypatch.context() as patch:
        patch.setattr(decoding, "decode", failing)
        with pytest.raises(CodecError, match="the codec failed"):
            list(ahead.stream(TEXT, seed=3, max_new_tokens=60))
    assert all(name.startswith("moss-codec") for name in calls)  # decoded on the worker
    _assert_same_chunks(list(ahead.stream(TEXT, seed=3)), list(inline.stream(TEXT, seed=3)))
