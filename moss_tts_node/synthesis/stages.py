"""The model's three stages and when they are in memory: the generation stage (llama.cpp backbone,
embedding tables, audio heads), the codec's encoder (only to encode a reference clip) and its decoder.

``ResidentStages`` loads them once and keeps them; ``PerRequestStages`` (``model.low_memory``, for 8 GB
boards) loads each for the duration of its use, one at a time, so a request generates every piece before
the decoder loads and nothing streams. Either way a stage is handed out as a context manager that yields
the loaded object, never ``None``: the pipeline does not know which kind it has, only whether the
decoder can run while the backbone generates (``streams``).

Where a stream decoder graph is configured (``audio.stream_decoder``), resident stages load it instead of
the published ``decoder.onnx``: streams decode on it chunk by chunk (``stream_decoding``), and so do
whole-utterance outputs, in larger chunks, through the codec they hand out (``StreamDecoderCodec``): its
output is the offline decode either way, and one decode graph is resident, not two.

Here the config is mapped onto each layer's own parameters (``BackboneParams``, ``CodecParams``).
"""

from __future__ import annotations

import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from moss_tts_node.codec.base import AudioCodec
from moss_tts_node.codec.factory import CodecParams, open_codec
from moss_tts_node.codec.nano import NanoOnnxCodec
from moss_tts_node.codec.stream_decoder import StreamDecoder, StreamDecoderCodec
from moss_tts_node.codec.streaming import StatefulStreamDecoding
from moss_tts_node.config import Config, backbone_path, stream_decoder_path
from moss_tts_node.errors import CodecError, ConfigError, WeightsError
from moss_tts_node.llama.backbone import Backbone, BackboneParams
from moss_tts_node.model.embeddings import EmbeddingTables
from moss_tts_node.model.heads import AudioHeads, load_audio_heads
from moss_tts_node.model.layout import EMBEDDINGS_DIR, HEADS_DIR, nano_local_gguf_name
from moss_tts_node.model.nano import NanoHeads, nano_heads_backend
from moss_tts_node.model.nano_local import OnnxLocalTransformer
from moss_tts_node.model.rates import frames_for_seconds
from moss_tts_node.model.spec import ModelSpec


def backbone_params(config: Config) -> BackboneParams:
    """The backbone's parameters: its GGUF and every ``llama.*`` key, by name."""
    return BackboneParams(gguf_path=backbone_path(config), **asdict(config.llama))


def codec_params(config: Config, spec: ModelSpec) -> CodecParams:
    model, audio = config.model, config.audio
    return CodecParams(
        backend=audio.backend,
        codec_dir=Path(model.codec_dir) if model.codec_dir else None,
        engine_dir=Path(model.engine_dir) if model.engine_dir else None,
        onnx_provider=audio.onnx_provider,
        threads=audio.codec_threads,
        max_frames=frames_for_seconds(audio.max_codec_seconds),
        n_quantizers=spec.n_vq,
        sample_rate=spec.sampling_rate,
    )


@dataclass(frozen=True)
class GenerationStage:
    """What the step loop runs on: the backbone, its input embedding tables and the audio heads."""

    backbone: Backbone
    embeddings: EmbeddingTables
    heads: AudioHeads

    @classmethod
    def load(cls, config: Config, spec: ModelSpec) -> GenerationStage:
        weights = Path(config.model.weights_dir)
        backbone = Backbone(backbone_params(config))
        try:
            heads = load_audio_heads(
                config.audio.heads_backend,
                weights / HEADS_DIR,
                spec,
                backbone.n_embd,
                backbone_path(config),
                threads=config.llama.n_threads,
                n_gpu_layers=config.llama.n_gpu_layers,
            )
            text_vocab = heads.text_vocab or backbone.n_vocab
            embeddings = EmbeddingTables(weights / EMBEDDINGS_DIR, spec, backbone.n_embd, text_vocab)
        except BaseException:
            backbone.close()
            raise
        return cls(backbone, embeddings, heads)

    def close(self) -> None:
        """Free llama.cpp's memory now; the NumPy tables and heads go once unreferenced."""
        self.heads.close()
        self.backbone.close()


@dataclass(frozen=True)
class NanoGenerationStage:
    """What MOSS-TTS-Nano's frame loop runs on (``model/nano.py``): the global transformer (the config's
    backbone GGUF, in llama.cpp), the local one (its GGUF beside it, ``layout.nano_local_gguf_name``, in ONNX Runtime:
    ``model/nano_local.py``), the input embedding tables and the heads tied to them."""

    backbone: Backbone
    local: OnnxLocalTransformer
    embeddings: EmbeddingTables
    heads: NanoHeads

    @classmethod
    def load(cls, config: Config, spec: ModelSpec) -> NanoGenerationStage:
        weights = Path(config.model.weights_dir)
        heads_backend = nano_heads_backend(config.audio.heads_backend)  # refused before anything loads
        params = backbone_params(config)
        local_path = params.gguf_path.with_name(nano_local_gguf_name(params.gguf_path.name))
        if not local_path.is_file():
            raise WeightsError(
                f"MOSS-TTS-Nano's local transformer not found: {local_path} (convert writes it beside "
                f"{params.gguf_path.name}; convert the checkpoint again)"
            )
        # The local transformer reads the n_vq + 1 positions of one frame; its cache is cleared every frame.
        local = OnnxLocalTransformer(local_path, spec.n_vq + 1)
        try:
            backbone = Backbone(params)
        except BaseException:
            local.close()
            raise
        try:
            if local.n_embd != backbone.n_embd:
                raise WeightsError(
                    f"{local_path} is {local.n_embd} wide, {params.gguf_path.name} {backbone.n_embd}: the two "
                    "transformers come from different models; convert the checkpoint again"
                )
            embeddings = EmbeddingTables(weights / EMBEDDINGS_DIR, spec, backbone.n_embd, spec.text_vocab_size)
            heads = NanoHeads(embeddings, spec, heads_backend)
        except BaseException:
            local.close()
            backbone.close()
            raise
        return cls(backbone, local, embeddings, heads)

    def close(self) -> None:
        self.heads.close()
        self.local.close()
        self.backbone.close()


def load_generation(config: Config, spec: ModelSpec) -> GenerationStage | NanoGenerationStage:
    """The generation stage of the model ``spec`` says the weights are."""
    return NanoGenerationStage.load(config, spec) if spec.is_nano else GenerationStage.load(config, spec)


class Stages(ABC):
    """The stages a synthesizer runs requests on. ``n_ctx`` is what llama.cpp made of ``llama.n_ctx``."""

    streams: bool  # whether the decoder can run while the backbone generates
    n_ctx: int
    weight_layout: str  # where llama.cpp keeps the backbone's weights, and why (Backbone.weight_layout)
    # How streams decode when a stream decoder is resident (its state is one utterance's); None: windowed.
    stream_decoding: StatefulStreamDecoding | None = None

    @abstractmethod
    def generation(self) -> Iterator[GenerationStage | NanoGenerationStage]:
        """A context manager: the generation stage, for one request's generation."""

    @abstractmethod
    def prepare_prefix(self, prefix: np.ndarray) -> int:
        """Have the (P, channels) prompt rows ``prefix`` in the KV cache ahead of the requests that begin with
        them, once no request is generating; returns the rows prefilled (0 where nothing was, or none can be)."""

    @abstractmethod
    def decoder(self) -> Iterator[AudioCodec]:
        """A context manager: a codec that decodes."""

    @abstractmethod
    def encoder(self) -> Iterator[AudioCodec]:
        """A context manager: a codec that encodes (reference clips)."""

    @abstractmethod
    def close(self) -> None:
        """Free every stage."""


class ResidentStages(Stages):
    """Every stage loaded once, at construction, and kept until ``close``.

    One backbone means one KV cache: ``prepare_prefix`` (maybe called from another thread than the one
    generating) waits until no request is generating, and ``generation`` waits for a preparation under way.
    """

    streams = True

    def __init__(self, config: Config, spec: ModelSpec) -> None:
        self._generation = load_generation(config, spec)
        try:
            decoder = _open_stream_decoder(config, spec)
            if decoder is None:
                self._codec = open_codec(codec_params(config, spec))
                if isinstance(self._codec, NanoOnnxCodec):  # its published decode-step graph streams exactly
                    self.stream_decoding = StatefulStreamDecoding(self._codec.stream_decoder())
            else:
                encoder = open_codec(codec_params(config, spec), decoder=False, encoder_optional=True)
                self._codec = StreamDecoderCodec(decoder, encoder)
                self.stream_decoding = StatefulStreamDecoding(decoder)
        except BaseException:
            self._generation.close()
            raise
        self.n_ctx = self._generation.backbone.n_ctx
        self.weight_layout = self._generation.backbone.weight_layout
        self._use = threading.Condition()
        self._generating = 0
        self._preparing = False

    @contextmanager
    def generation(self) -> Iterator[GenerationStage | NanoGenerationStage]:
        with self._use:
            self._use.wait_for(lambda: not self._preparing)
            self._generating += 1
        try:
            yield self._generation
        finally:
            with self._use:
                self._generating -= 1
                self._use.notify_all()

    def prepare_prefix(self, prefix: np.ndarray) -> int:
        with self._use:
            self._use.wait_for(lambda: self._generating == 0 and not self._preparing)
            self._preparing = True
        try:
            stage = self._generation
            return stage.backbone.prepare_prefix(prefix, stage.embeddings.embed)
        finally:
            with self._use:
                self._preparing = False
                self._use.notify_all()

    @contextmanager
    def decoder(self) -> Iterator[AudioCodec]:
        yield self._codec

    @contextmanager
    def encoder(self) -> Iterator[AudioCodec]:
        yield self._codec

    def close(self) -> None:
        self._generation.close()
        self._codec.close()
        self.stream_decoding = None  # its caches and graph go with it


class PerRequestStages(Stages):
    """Each stage loaded for the duration of its use, one at a time (``model.low_memory``).

    Construction loads each stage once and frees it, so bad files fail at start-up as with resident
    stages. A reloaded backbone starts with an empty KV cache: there is no prefix to prepare or reuse.
    """

    streams = False

    def __init__(self, config: Config, spec: ModelSpec) -> None:
        self._config = config
        self._spec = spec
        with self.generation() as stage:
            self.n_ctx = stage.backbone.n_ctx
            self.weight_layout = stage.backbone.weight_layout  # each reload places them alike
        open_codec(codec_params(config, spec)).close()

    @contextmanager
    def generation(self) -> Iterator[GenerationStage | NanoGenerationStage]:
        stage = load_generation(self._config, self._spec)
        try:
            yield stage
        finally:
            stage.close()

    def prepare_prefix(self, prefix: np.ndarray) -> int:
        return 0  # the backbone is reloaded per request, with an empty KV cache

    @contextmanager
    def decoder(self) -> Iterator[AudioCodec]:
        with open_codec(codec_params(self._config, self._spec), encoder=False) as codec:
            yield codec

    @contextmanager
    def encoder(self) -> Iterator[AudioCodec]:
        with open_codec(codec_params(self._config, self._spec), decoder=False) as codec:
            yield codec

    def close(self) -> None:
        pass  # nothing stays loaded


def _open_stream_decoder(config: Config, spec: ModelSpec) -> StreamDecoder | None:
    """The stream decoder ``audio.stream_decoder`` selects, loaded and checked now (for the model's codebooks);
    None for the windowed scheme."""
    path = stream_decoder_path(config)
    if path is None:
        return None
    try:  # a graph is built for a number of codebooks (build-stream-decoder --quantizers): the model's
        return StreamDecoder(path, threads=config.audio.codec_threads, quantizers=spec.n_vq)
    except CodecError as error:
        raise ConfigError(
            f"'audio.stream_decoder' {config.audio.stream_decoder} selects a graph that cannot be used: {error}; "
            "or set 'audio.stream_decoder' to off"
        ) from error


def open_stages(config: Config, spec: ModelSpec) -> Stages:
    config = with_allotted_threads(config, len(os.sched_getaffinity(0)))
    return PerRequestStages(config, spec) if config.model.low_memory else ResidentStages(config, spec)


def codec_core_share(cores: int) -> int:
    """The cores the codec's thread gets when it decodes ahead: one, or a quarter of them above 4, where llama.cpp's
    gain from one core more is small and the full-size codec's call is long."""
    return 1 if cores <= 4 else cores // 4


def decodes_ahead(config: Config) -> bool:
    """Whether this config's streamed audio is decoded on a thread of its own (``low_memory`` never streams)."""
    return config.audio.decode_ahead and not config.model.low_memory


def with_allotted_threads(config: Config, cores: int) -> Config:
    """``config`` with the thread counts left at 0 chosen, where the codec decodes ahead (streaming, not
    low_memory): the codec its share of the ``cores`` and llama.cpp the rest, or each what the other's count leaves
    (at least one), so that neither stage's threads wait for a core the other holds (docs/design.md, "Threads"); a
    prefill, before there is audio to decode, takes both shares. Otherwise the zeros stay: llama.cpp takes every
    core, for steps and prefills alike, ONNX Runtime chooses."""
    llama, audio = config.llama, config.audio
    if not decodes_ahead(config):
        return config
    codec = audio.codec_threads or (max(1, cores - llama.n_threads) if llama.n_threads else codec_core_share(cores))
    threads = llama.n_threads or max(1, cores - codec)
    batch = llama.n_threads_batch or threads + codec
    allotted = replace(llama, n_threads=threads, n_threads_batch=batch)
    return replace(config, llama=allotted, audio=replace(audio, codec_threads=codec))
