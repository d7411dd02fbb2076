"""Configuration: one schema for the CLI, the Python API and the ROS node.

Config files are ROS 2 parameter files::

    moss_tts_node:
      ros__parameters:
        model:
          weights_dir: /models/MOSS-TTS-GGUF
        llama:
          n_gpu_layers: -1

so the same file serves ``python -m moss_tts_node synth --config``, ``Synthesizer.from_config_file``
and ``ros2 run moss_tts_node moss_tts_node --ros-args --params-file``. Nested keys become dotted
names (``llama.n_gpu_layers``). Every key is declared once, below, with its type, default, range
and description; the ROS node declares its parameters from this same list.

Everything is validated when the file is loaded: unknown keys, wrong types, values out of range
and missing files fail before any model is touched, naming the key and the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from moss_tts_node.choices import (
    BACKEND_LOCAL,
    BACKEND_REMOTE,
    BACKENDS,
    CODEC_BACKENDS,
    FLASH_ATTN_MODES,
    HEADS_BACKENDS,
    KV_CACHE_TYPES,
    ONNX_PROVIDERS,
    OUTPUT_CHANNELS,
    OUTPUT_CHANNELS_MODEL,
    PAUSE_MARKER_MODES,
    STREAM_DECODER_MODES,
    UNQUANTIZED_KV_CACHE_TYPES,
)
from moss_tts_node.codec.layout import DECODER_FILE, ENCODER_FILE, NANO_META_FILE, STREAM_DECODER_FILE
from moss_tts_node.errors import ConfigError
from moss_tts_node.model.family import RecommendedSampling
from moss_tts_node.model.layout import CONFIG_FILE, DEFAULT_GGUF, EMBEDDINGS_DIR, HEADS_DIR, TOKENIZER_DIR
from moss_tts_node.model.rates import MAX_CODEC_SECONDS
from moss_tts_node.text.languages import language_tag

NODE_NAME = "moss_tts_node"


def _option(
    default: Any,
    doc: str,
    *,
    min: float | None = None,
    max: float | None = None,
    choices: tuple[str, ...] | None = None,
    path: bool = False,
    keywords: tuple[str, ...] = (),
    per_request: bool = False,
    unset: float | None = None,
    unset_means: str = "the model's recommendation",
) -> Any:
    """A config field with the metadata the validator and the ROS node need; ``keywords`` are the words a
    ``path`` field also takes, which are not resolved as paths. ``per_request``: the synthesizer reads the
    key for each request (from the settings the request was accepted under), so a running node may change
    it; every other key is read when the model loads. ``unset``: a value below ``min`` that the key also takes,
    meaning "not set here" (a ROS parameter cannot be null), and then ``unset_means`` applies."""
    meta = {
        "doc": doc,
        "min": min,
        "max": max,
        "choices": choices,
        "path": path,
        "keywords": keywords,
        "per_request": per_request,
        "unset": unset,
        "unset_means": unset_means,
    }
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelConfig:
    backend: str = _option(
        BACKEND_LOCAL,
        "Where the speech comes from: local, this machine's model (the keys below); remote, an OpenAI-compatible "
        'speech server at remote_url (docs/http.md, "Remote backend"), and no model here.',
        choices=BACKENDS,
    )
    remote_url: str = _option(
        "",
        "With backend remote: the speech server's base URL, up to /v1 (http://gpu-server:8000/v1).",
    )
    remote_model: str = _option(
        "",
        "With backend remote: the model the server is asked for; empty, the first it lists at GET /v1/models.",
    )
    remote_api_key_file: str = _option(
        "",
        "With backend remote: a file holding the server's API key, sent as 'Authorization: Bearer'; empty for none. "
        "A file, not the key: any participant of the DDS domain may read a parameter.",
        path=True,
    )
    weights_dir: str = _option(
        "",
        f"Directory of MOSS-TTS-GGUF: the GGUF, {EMBEDDINGS_DIR}/, {HEADS_DIR}/, {TOKENIZER_DIR}/ and {CONFIG_FILE}.",
        path=True,
    )
    backbone_gguf: str = _option(
        DEFAULT_GGUF,
        "Backbone GGUF file: a name inside weights_dir, or a path.",
    )
    codec_dir: str = _option(
        "",
        f"Directory of MOSS-Audio-Tokenizer-ONNX: {DECODER_FILE} (and {ENCODER_FILE} for voice cloning).",
        path=True,
    )
    engine_dir: str = _option(
        "",
        "Directory of TensorRT codec engines made by build-engines (used when audio.backend is tensorrt).",
        path=True,
    )
    low_memory: bool = _option(
        False,
        "Load encoder, backbone and decoder one at a time (8 GB boards): no streaming, each request reloads them.",
    )


@dataclass(frozen=True)
class LlamaConfig:
    n_ctx: int = _option(
        4096,
        "Context length in rows: prompt plus generated steps. llama.cpp rounds it up to a multiple of 256.",
        min=64,
        max=131072,
    )
    n_batch: int = _option(512, "Rows per llama.cpp batch during prefill (capped at n_ctx).", min=1, max=131072)
    n_threads: int = _option(
        0, "llama.cpp CPU threads; 0 uses every core (but the codec's share with audio.decode_ahead).", min=0, max=1024
    )
    n_threads_batch: int = _option(
        0,
        "llama.cpp CPU threads for a prompt's prefill (its -tb); 0: n_threads, and with audio.decode_ahead the "
        "codec's threads too (the codec has nothing to decode while a request's prompt prefills).",
        min=0,
        max=1024,
    )
    n_gpu_layers: int = _option(-1, "Layers offloaded to the GPU: -1 all, 0 CPU only.", min=-1, max=100000)
    kv_cache_type_k: str = _option("f16", "KV cache type of keys.", choices=KV_CACHE_TYPES)
    kv_cache_type_v: str = _option(
        "f16",
        "KV cache type of values; a quantized one needs flash attention (flash_attn auto or on).",
        choices=KV_CACHE_TYPES,
    )
    flash_attn: str = _option("auto", "Flash attention: auto, on or off.", choices=FLASH_ATTN_MODES)
    repack: bool = _option(
        True,
        "Let llama.cpp repack quantized weights on the CPU into its faster layout (CPU_REPACK): faster steps, a "
        "slower prefill. false keeps the GGUF's own layout, as llama-cli's --no-repack. Intel's AMX layout is never "
        'used: its kernel crashes (docs/install.md, "Intel CPUs with AMX").',
    )


@dataclass(frozen=True)
class AudioConfig:
    backend: str = _option(
        "onnx", "Codec backend: onnx (ONNX Runtime) or tensorrt (engines in model.engine_dir).", choices=CODEC_BACKENDS
    )
    max_codec_seconds: float = _option(
        MAX_CODEC_SECONDS,
        "Longest audio one codec call handles; longer audio is coded in windows (TensorRT: also its engines' limit).",
        min=0.08,
        max=3600.0,
    )
    onnx_provider: str = _option(
        "auto",
        "ONNX Runtime device: auto (CUDA where this onnxruntime has it: onnxruntime-gpu, docs/install.md), cpu "
        "or cuda.",
        choices=ONNX_PROVIDERS,
    )
    codec_threads: int = _option(
        0,
        "ONNX Runtime intra-op threads; 0 lets it choose, or with decode_ahead takes the codec's share of the cores.",
        min=0,
        max=1024,
    )
    decode_ahead: bool = _option(
        True,
        "Decode streamed audio on a thread of its own while the next frames generate. With llama.n_threads and "
        "codec_threads at 0 the cores are shared out: one for the codec (a quarter of them above 4), the rest for "
        'llama.cpp (docs/design.md, "Threads"). false decodes between the steps, each on every core.',
    )
    chunk_frames: int = _option(
        5,
        "Frames (80 ms each) per streamed chunk after the first (always one frame, as soon as the delay pattern "
        "completes it: after one step per codebook of the model): "
        'smaller arrives more evenly, costs more codec calls (docs/stream-decoder.md, "Streaming": the trade-off).',
        min=1,
        max=500,
        per_request=True,
    )
    left_context_frames: int = _option(
        5,
        "Frames of already-played codes re-decoded before each streamed chunk so it joins smoothly; each "
        "chunk decodes this many frames more. Whole-utterance outputs are decoded offline and ignore it.",
        min=0,
        max=500,
        per_request=True,
    )
    stream_decoder: str = _option(
        "auto",
        f"Streaming decode: auto (model.codec_dir/{STREAM_DECODER_FILE}, made by build-stream-decoder, when it "
        "exists: each chunk decodes only its new frames, as the offline decode; else re-decoding with "
        "left_context_frames), off (always re-decode), or a path to a stream decoder graph. It runs in ONNX Runtime "
        "on the CPU whatever the backend; where one is loaded, whole utterances decode on it too and decoder.onnx "
        'is not loaded (docs/stream-decoder.md, "Streaming").',
        path=True,
        keywords=STREAM_DECODER_MODES,
    )
    heads_backend: str = _option(
        "auto",
        "Audio heads: gguf (inside llama.cpp, needs a GGUF that carries them: attach-heads), onnx (8-bit, "
        "ONNX Runtime), numpy (exact float32, 0.54 GB), or auto (gguf when the GGUF carries them and layers "
        "run on a GPU, else onnx). MOSS-TTS-Nano's heads are its audio tables: onnx or numpy (auto: onnx), no gguf.",
        choices=HEADS_BACKENDS,
    )
    output_sample_rate: int = _option(
        0,
        "Sample rate (Hz) of the audio given out (the node's topics and service, files, HTTP bodies, playback); 0 "
        "keeps the model's (24000, MOSS-TTS-Nano 48000). Another is converted as it streams, by soxr "
        '(docs/usage.md, "Output audio").',
        min=8000,
        max=192000,
        unset=0,
        unset_means="the model's rate",
    )
    output_channels: str = _option(
        OUTPUT_CHANNELS_MODEL,
        "Channels of the audio given out: model keeps the model's (mono, MOSS-TTS-Nano stereo), mono takes the mean "
        'of the channels, stereo copies mono to both (docs/usage.md, "Output audio").',
        choices=OUTPUT_CHANNELS,
    )


# A sampling key at this value is not set: the model's recommended value applies (docs/family.md, "Sampling").
MODEL_RECOMMENDS = -1
_MODELS = "-1 (the default): the model's recommendation (docs/family.md)"


def _sampling(doc: str, *, min: float, max: float, integer: bool = False) -> Any:
    """A sampling key whose default is the model's recommendation."""
    default = MODEL_RECOMMENDS if integer else float(MODEL_RECOMMENDS)
    return _option(default, f"{doc} {_MODELS}.", min=min, max=max, per_request=True, unset=default)


@dataclass(frozen=True)
class SamplingConfig:
    """How a request samples. A key left at -1 takes the recommendation of the model the weights are
    (``model/family.py``): for MOSS-TTS, the values upstream's ``generate`` defaults to (docs/model.md,
    "Sampling"). A request's own section overrides this one key by key (``resolved_sampling``)."""

    text_temperature: float = _sampling("Text channel temperature; 0 is greedy.", min=0.0, max=100.0)
    text_top_k: int = _sampling("Text channel top-k; 0 disables.", min=0, max=1000000, integer=True)
    text_top_p: float = _sampling("Text channel top-p.", min=0.0, max=1.0)
    audio_temperature: float = _sampling("Audio channels temperature; 0 is greedy.", min=0.0, max=100.0)
    audio_top_k: int = _sampling("Audio channels top-k; 0 disables.", min=0, max=1025, integer=True)
    audio_top_p: float = _sampling("Audio channels top-p.", min=0.0, max=1.0)
    audio_repetition_penalty: float = _sampling("Audio repetition penalty; 1.0 disables.", min=0.01, max=100.0)
    seed: int = _option(
        -1, "Random seed of each request; -1 draws a fresh one.", min=-1, max=2**63 - 1, per_request=True
    )


def resolved_sampling(recommended: RecommendedSampling, *layers: SamplingConfig) -> SamplingConfig:
    """The sampling a request runs with: each key from the first of ``layers`` (the request's section, then the
    config's) that sets it, else the model's ``recommended`` value; the seed from the first that sets one (-1 in
    all: drawn per request)."""
    values = {}
    for f in dataclasses.fields(SamplingConfig):
        unset = OPTIONS[f"sampling.{f.name}"].unset if f.name != "seed" else -1
        chosen = next((getattr(layer, f.name) for layer in layers if getattr(layer, f.name) != unset), unset)
        values[f.name] = getattr(recommended, f.name) if chosen == unset and f.name != "seed" else chosen
    return SamplingConfig(**values)


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = _option(
        1500,
        "Most generation steps (80 ms of audio each); clamped to what n_ctx leaves.",
        min=1,
        max=1000000,
        per_request=True,
    )
    normalize_text: bool = _option(
        True, "Clean markdown and punctuation from the text before speaking.", per_request=True
    )
    language: str = _option(
        "",
        "Default language: a code (en, zh, ...) or English name (French, ...) of the model's languages, in any "
        'letter case (docs/usage.md, "Languages"); empty prints None in the prompt.',
        per_request=True,
    )
    pause_markers: str = _option(
        "auto",
        "What a [pause X.Ys] in the text means: model (the model makes the pause; v1.5), silence (exactly that "
        "much silence between the speech around it), text (plain text), or auto (model for a checkpoint converted "
        'from v1.5, else silence) (docs/usage.md, "Pause markers").',
        choices=PAUSE_MARKER_MODES,
        per_request=True,
    )
    instruction: str = _option("", "Default style instruction; empty prints None.", per_request=True)
    quality: str = _option("", "Default quality field of the prompt; empty prints None.", per_request=True)
    reference_audio: str = _option(
        "",
        "Default voice: a WAV/FLAC clip or a .npy of codes from encode-voice; empty for none. It is one of the "
        "voices too, named by its file name without the extension.",
        path=True,
    )


@dataclass(frozen=True)
class LimitsConfig:
    """What one request may ask for, checked before any heavy work (docs/security.md, "Request checks")."""

    max_text_chars: int = _option(
        2000,
        "Most characters of a request's text, language, instruction, quality, prefix_text, sound_event, ambient_sound "
        "and scene together; a longer request is refused before its text is cleaned or tokenized.",
        min=1,
        max=10_000_000,
        per_request=True,
    )
    max_reference_seconds: float = _option(
        30.0,
        "Longest voice a reference clip or .npy of codes may hold; a clip's duration is read from its header "
        "and a longer one refused before it is decoded.",
        min=0.08,
        max=3600.0,
        per_request=True,
    )


@dataclass(frozen=True)
class VoicesConfig:
    """The voices a request may name (synthesis/voices.py: VoiceLibrary), encoded when the model loads."""

    files: tuple[str, ...] = _option(
        (),
        "Voices by name: WAV/FLAC/OGG clips or .npy codes from encode-voice, each named by its file name "
        "without the extension; a NAME.txt beside one is its transcript, for continuing it (docs/continuation.md).",
        path=True,
    )
    directories: tuple[str, ...] = _option(
        (),
        "Folders of voices: every clip or .npy directly inside is a voice named by its file name without the "
        "extension. A ROS request may also give the path of one of these files, and of no other file.",
        path=True,
    )


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    llama: LlamaConfig = field(default_factory=LlamaConfig)
    audio: AudioConfig = field(default_factory=AudioConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    voices: VoicesConfig = field(default_factory=VoicesConfig)


@dataclass(frozen=True)
class Option:
    """One config key as the ROS node declares it."""

    key: str
    type: type
    default: Any
    doc: str
    min: float | None
    max: float | None
    choices: tuple[str, ...] | None
    path: bool
    keywords: tuple[str, ...] = ()
    per_request: bool = False  # read for each request, so a running node may change it (see _option)
    unset: float | None = None  # a value below min that means "not set here" (see _option)
    unset_means: str = "the model's recommendation"  # what applies then

    @property
    def lowest(self) -> float | None:
        """The least value the key takes: ``min``, or ``unset`` below it."""
        return self.min if self.unset is None or self.min is None else min(self.min, self.unset)

    def names_a_path(self, value: Any) -> bool:
        """Whether ``value`` of this option is a path (to resolve against the params file's folder)."""
        return self.path and isinstance(value, str) and bool(value) and value not in self.keywords

    def resolved(self, value: Any, base_dir: Path) -> Any:
        """``value`` with the paths it names (itself, or each item of a list) taken from ``base_dir``."""
        if self.path and isinstance(value, list | tuple):
            return type(value)(self.resolved(item, base_dir) for item in value)
        if self.names_a_path(value):
            return str((base_dir / Path(value).expanduser()).resolve())
        return value


_GROUP_TYPES = {
    "model": ModelConfig,
    "llama": LlamaConfig,
    "audio": AudioConfig,
    "sampling": SamplingConfig,
    "generation": GenerationConfig,
    "limits": LimitsConfig,
    "voices": VoicesConfig,
}
# Field annotations are strings here (postponed evaluation); these are the only types in use. A tuple is a
# list of strings in a file or a ROS parameter.
_FIELD_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "tuple[str, ...]": tuple}


def options() -> Iterator[Option]:
    """Every config key, in file order."""
    for group_name, group_type in _GROUP_TYPES.items():
        for f in dataclasses.fields(group_type):
            yield Option(key=f"{group_name}.{f.name}", type=_FIELD_TYPES[f.type], default=f.default, **f.metadata)


OPTIONS: dict[str, Option] = {o.key: o for o in options()}


def flatten(config: Config) -> Iterator[tuple[str, Any]]:
    for group_name in _GROUP_TYPES:
        group = getattr(config, group_name)
        for f in dataclasses.fields(group):
            yield f"{group_name}.{f.name}", getattr(group, f.name)


def check_per_request_change(current: Config, new: Config) -> None:
    """ConfigError unless ``new`` differs from ``current`` only in keys marked ``per_request``: the others made a
    loaded synthesizer (its model, planner and voices), which a new one must be loaded to change."""
    old = dict(flatten(current))
    fixed = [key for key, value in flatten(new) if not OPTIONS[key].per_request and value != old[key]]
    if fixed:
        raise ConfigError(f"{', '.join(fixed)} cannot change while the model is loaded: load it with the new settings")


def load_config(path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None) -> Config:
    """Read a ROS 2 params file, apply dotted overrides, and validate all of it."""
    path = Path(path)
    values = dict(_checked_items(read_params_file(path), str(path)))
    if overrides:
        values.update(_checked_items(overrides, "override"))
    return from_flat(values, path.parent, source=str(path))


def read_params_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The node's parameters in a params file, flat (dotted keys) and as written: not yet validated."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (see config/default.yaml for an example)")
    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    return dict(_flatten_mapping(_ros_parameters(document, path)))


def write_params_file(path: str | os.PathLike[str], values: Mapping[str, Any], header: str = "") -> None:
    """Write dotted ``values`` as a params file that ``read_params_file`` reads back; ``header`` becomes
    its leading comment lines."""
    nested: dict[str, Any] = {}
    for key, value in values.items():
        *groups, name = key.split(".")
        section = nested
        for group in groups:
            section = section.setdefault(group, {})
        section[name] = value
    comment = "".join(f"# {line}\n".replace("# \n", "#\n") for line in header.splitlines())
    document = yaml.safe_dump({NODE_NAME: {"ros__parameters": nested}}, sort_keys=False)
    Path(path).write_text(comment + document, encoding="utf-8")


def from_flat(values: Mapping[str, Any], base_dir: Path, source: str) -> Config:
    """Build a Config from dotted keys; relative paths are taken from base_dir."""
    groups: dict[str, dict[str, Any]] = {name: {} for name in _GROUP_TYPES}
    for key, value in values.items():
        group, name = key.split(".", 1)
        groups[group][name] = OPTIONS[key].resolved(value, base_dir)
    config = Config(**{name: _GROUP_TYPES[name](**kw) for name, kw in groups.items()})
    _check_llama(config, source)
    _check_language(config, source)
    _check_files(config, source)
    return config


def _check_llama(config: Config, source: str) -> None:
    """What the single keys' ranges cannot say (each llama.* value is checked here and nowhere else)."""
    llama = config.llama
    if llama.kv_cache_type_v not in UNQUANTIZED_KV_CACHE_TYPES and llama.flash_attn == "off":
        raise ConfigError(
            f"{source}: 'llama.kv_cache_type_v' {llama.kv_cache_type_v} (quantized) needs flash attention: "
            "set 'llama.flash_attn' to auto or on, or use an f16 V cache"
        )


def _check_language(config: Config, source: str) -> None:
    language = config.generation.language
    if language:
        try:
            language_tag(language)
        except ValueError as error:
            raise ConfigError(f"{source}: 'generation.language': {error}") from None


def _ros_parameters(document: Any, path: Path) -> Mapping[str, Any]:
    hint = f"expected '{NODE_NAME}:' then 'ros__parameters:' at the top (see config/default.yaml)"
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: {hint}")
    for node_key in (NODE_NAME, f"/{NODE_NAME}", "/**"):
        section = document.get(node_key)
        if isinstance(section, dict) and "ros__parameters" in section:
            params = section["ros__parameters"]
            if not isinstance(params, dict):
                raise ConfigError(f"{path}: 'ros__parameters' must be a mapping")
            return params
    raise ConfigError(f"{path}: {hint}; found top-level keys {sorted(map(str, document))}")


def _flatten_mapping(params: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in params.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            yield from _flatten_mapping(value, prefix=f"{dotted}.")
        else:
            yield dotted, value


def _checked_items(values: Mapping[str, Any], source: str) -> Iterator[tuple[str, Any]]:
    for key, value in values.items():
        option = OPTIONS.get(key)
        if option is None:
            raise ConfigError(f"{source}: unknown config key '{key}'{_suggestion(key)}")
        yield key, check_value(option, value, source)


def check_value(option: Option, value: Any, source: str) -> Any:
    """Validate one value against its option; returns it (ints widened to float where a float is due)."""
    where = f"{source}: '{option.key}'"
    if option.type is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if option.type is str and value is None:
        value = ""
    if option.type is str and isinstance(value, bool):
        raise ConfigError(
            f"{where} must be a string, got {value!r}: YAML reads bare on/off/yes/no as booleans, so quote it"
        )
    if option.type is tuple:
        return _checked_strings(where, value)
    if type(value) is not option.type:
        raise ConfigError(f"{where} must be {option.type.__name__}, got {type(value).__name__} {value!r}")
    if option.type is float and math.isnan(value):  # NaN passes every comparison below
        raise ConfigError(f"{where} must be a number, got {value!r}")
    if option.unset is not None and value == option.unset:
        return value
    if option.choices is not None and value not in option.choices:
        raise ConfigError(f"{where} must be one of {', '.join(option.choices)}, got {value!r}")
    if option.min is not None and value < option.min:
        unset = "" if option.unset is None else f" (or {option.unset!r} for {option.unset_means})"
        raise ConfigError(f"{where} must be >= {option.min}{unset}, got {value!r}")
    if option.max is not None and value > option.max:
        raise ConfigError(f"{where} must be <= {option.max}, got {value!r}")
    return value


def _checked_strings(where: str, value: Any) -> tuple[str, ...]:
    """A list of non-empty strings as a tuple. ROS reads an empty list (``[]`` in a params file) as a parameter
    without a value (None), or as an empty byte array: both are the empty list."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(item, str) and item for item in value):
        raise ConfigError(f"{where} must be a list of non-empty strings, got {value!r}")
    return tuple(value)


def _suggestion(key: str) -> str:
    near = difflib.get_close_matches(key, OPTIONS, n=1, cutoff=0.6)
    if not near:
        leaf = key.rsplit(".", 1)[-1]
        near = [k for k in OPTIONS if k.rsplit(".", 1)[-1] == leaf]
    if near:
        return f"; did you mean '{near[0]}'?"
    return f"; known keys: {', '.join(OPTIONS)}"


def _check_files(config: Config, source: str) -> None:
    model = config.model
    if model.backend == BACKEND_REMOTE:
        _check_remote(config, source)
        return
    if not model.weights_dir:
        raise ConfigError(f"{source}: 'model.weights_dir' is not set (the MOSS-TTS-GGUF directory)")
    if not Path(model.weights_dir).is_dir():
        raise ConfigError(f"{source}: 'model.weights_dir' directory not found: {model.weights_dir}")
    gguf = backbone_path(config)
    if not gguf.is_file():
        from moss_tts_node.model.layout import attach_heads_command, is_heads_gguf_name

        hint = (
            f" (make it with: {attach_heads_command(gguf.parent, gguf.name)})" if is_heads_gguf_name(gguf.name) else ""
        )
        raise ConfigError(f"{source}: 'model.backbone_gguf' file not found: {gguf}{hint}")
    if config.audio.backend == "tensorrt":
        # The engines themselves are checked when the codec opens: they are often built on the
        # robot after its config is written, and only TensorRT can tell whether they fit this GPU.
        if not model.engine_dir:
            raise ConfigError(
                f"{source}: 'model.engine_dir' is not set; audio.backend tensorrt needs the engines "
                "made by `python -m moss_tts_node build-engines`"
            )
    else:
        if not model.codec_dir:
            raise ConfigError(
                f"{source}: 'model.codec_dir' is not set (the MOSS-Audio-Tokenizer-ONNX directory, or "
                "MOSS-Audio-Tokenizer-Nano-ONNX for MOSS-TTS-Nano)"
            )
        codec = Path(model.codec_dir)
        if not (codec / DECODER_FILE).is_file() and not (codec / NANO_META_FILE).is_file():
            raise ConfigError(
                f"{source}: 'model.codec_dir' {codec} has neither {DECODER_FILE} (MOSS-Audio-Tokenizer-ONNX) nor "
                f"{NANO_META_FILE} (MOSS-Audio-Tokenizer-Nano-ONNX): point it at the codec's download"
            )
    _check_stream_decoder(config, source)
    reference = config.generation.reference_audio
    if reference and not Path(reference).is_file():
        raise ConfigError(f"{source}: 'generation.reference_audio' file not found: {reference}")
    for voice in config.voices.files:
        if not Path(voice).is_file():
            raise ConfigError(f"{source}: 'voices.files' file not found: {voice}")
    for directory in config.voices.directories:
        if not Path(directory).is_dir():
            raise ConfigError(f"{source}: 'voices.directories' directory not found: {directory}")


def _check_remote(config: Config, source: str) -> None:
    """A remote backend's URL and key file; its voices are the server's, named in requests, so none is configured
    here."""
    model = config.model
    if not model.remote_url.startswith(("http://", "https://")):
        raise ConfigError(
            f"{source}: 'model.remote_url' must be the speech server's http:// or https:// base URL (up to /v1) with "
            f"model.backend remote, got {model.remote_url!r}"
        )
    if model.remote_api_key_file and not Path(model.remote_api_key_file).is_file():
        raise ConfigError(f"{source}: 'model.remote_api_key_file' file not found: {model.remote_api_key_file}")
    audio = config.audio
    if audio.output_sample_rate or audio.output_channels != OUTPUT_CHANNELS_MODEL:
        raise ConfigError(
            f"{source}: 'audio.output_sample_rate' or 'audio.output_channels' is set, but with model.backend remote "
            "the audio is the server's 24 kHz mono PCM, given out as it comes: leave them at 0 and model"
        )
    for key, value in (
        ("generation.reference_audio", config.generation.reference_audio),
        ("voices.files", config.voices.files),
        ("voices.directories", config.voices.directories),
    ):
        if value:
            raise ConfigError(
                f"{source}: '{key}' is set, but with model.backend remote the voices are the server's: leave it "
                "empty, and name the server's voices in requests (GET /v1/audio/voices lists them)"
            )


def _check_stream_decoder(config: Config, source: str) -> None:
    """An explicit graph must exist; whether it is a stream decoder graph only ONNX Runtime can tell, so the
    synthesizer checks that when it loads the graph (naming this key too)."""
    graph = config.audio.stream_decoder
    if graph not in STREAM_DECODER_MODES and not Path(graph).is_file():
        raise ConfigError(
            f"{source}: 'audio.stream_decoder' file not found: {graph}; build it with `python -m moss_tts_node "
            f"build-stream-decoder <codec checkpoint dir> --out {graph}`, or set it to auto or off"
        )


def stream_decoder_path(config: Config) -> Path | None:
    """The stream decoder graph ``audio.stream_decoder`` selects, or None for the windowed scheme.

    ``auto`` takes the graph beside the codec's ONNX graphs when it is there (with either backend: it
    runs in ONNX Runtime on the CPU). ``model.low_memory`` never streams, so it selects none.
    """
    graph = config.audio.stream_decoder
    if config.model.low_memory or graph == "off":
        return None
    if graph == "auto":
        beside = Path(config.model.codec_dir) / STREAM_DECODER_FILE
        return beside if config.model.codec_dir and beside.is_file() else None
    return Path(graph)


def backbone_path(config: Config) -> Path:
    return Path(config.model.weights_dir) / config.model.backbone_gguf
