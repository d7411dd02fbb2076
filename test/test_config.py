"""Config files: validated at load time, every error naming the key and the file."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import linked_copy

from moss_tts_node.choices import STREAM_DECODER_MODES
from moss_tts_node.codec.layout import STREAM_DECODER_FILE
from moss_tts_node.config import OPTIONS, flatten, load_config, stream_decoder_path, write_params_file
from moss_tts_node.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text("moss_tts_node:\n  ros__parameters:\n" + body, encoding="utf-8")
    return path


def demo_paths(demo_config: Path) -> dict[str, str]:
    weights = demo_config.parent
    return {
        "model.weights_dir": str(weights),
        "model.codec_dir": str(weights / "codec"),
        "model.backbone_gguf": load_config(demo_config).model.backbone_gguf,
    }


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "config").glob("*.yaml")))
def test_shipped_config_files_are_valid(name: str, demo_config: Path) -> None:
    config = load_config(REPO / "config" / name, overrides=demo_paths(demo_config))
    assert config.model.weights_dir == str(demo_config.parent)


def test_shipped_config_files_list_every_key() -> None:
    """A newcomer reads default.yaml as the reference: it must show every key."""
    text = (REPO / "config" / "default.yaml").read_text()
    for key in OPTIONS:
        assert f" {key.split('.')[1]}:" in text, key


def test_relative_paths_are_taken_from_the_file(demo_config: Path) -> None:
    config = load_config(demo_config)
    assert Path(config.model.weights_dir) == demo_config.parent.resolve()


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "    llama:\n      n_gpu_layer: 3\n")
    with pytest.raises(ConfigError, match=r"params\.yaml.*'llama\.n_gpu_layer'.*did you mean") as err:
        load_config(path)
    assert "llama.n_gpu_layers" in str(err.value)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("    llama:\n      n_ctx: big\n", r"'llama\.n_ctx' must be int, got str"),
        ("    llama:\n      n_gpu_layers: -2\n", r"'llama\.n_gpu_layers' must be >= -1"),
        ("    llama:\n      flash_attn: off\n", r"'llama\.flash_attn' .*quote it"),
        ("    llama:\n      kv_cache_type_k: q9\n", r"must be one of f32, f16"),
        ("    sampling:\n      audio_top_p: 1.5\n", r"'sampling\.audio_top_p' must be <= 1\.0"),
        ("    generation:\n      normalize_text: 1\n", r"must be bool, got int"),
    ],
)
def test_bad_values_fail_at_load(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, body))


def test_int_is_accepted_where_a_float_is_due(tmp_path: Path, demo_config: Path) -> None:
    config = load_config(demo_config, overrides={"sampling.text_temperature": 1})
    assert config.sampling.text_temperature == 1.0 and isinstance(config.sampling.text_temperature, float)


def test_missing_files_are_named(tmp_path: Path, demo_config: Path) -> None:
    with pytest.raises(ConfigError, match=r"'model\.weights_dir' is not set"):
        load_config(write(tmp_path, "    llama:\n      n_ctx: 512\n"))
    with pytest.raises(ConfigError, match=r"'model\.backbone_gguf' file not found: .*nope\.gguf"):
        load_config(demo_config, overrides={"model.backbone_gguf": "nope.gguf"})
    with pytest.raises(ConfigError, match=r"make it with: python -m moss_tts_node attach-heads .* --gguf M\.gguf\)"):
        load_config(demo_config, overrides={"model.backbone_gguf": "M_audio_heads.gguf"})
    with pytest.raises(ConfigError, match=r"'generation\.reference_audio' file not found"):
        load_config(demo_config, overrides={"generation.reference_audio": str(tmp_path / "voice.wav")})


def test_not_a_params_file(tmp_path: Path) -> None:
    path = tmp_path / "plain.yaml"
    path.write_text("llama:\n  n_ctx: 4\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="ros__parameters"):
        load_config(path)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")


def test_overrides_are_validated_like_the_file(demo_config: Path) -> None:
    assert load_config(demo_config, overrides={"llama.n_threads": 1}).llama.n_threads == 1
    with pytest.raises(ConfigError, match=r"unknown config key 'llama\.threads'"):
        load_config(demo_config, overrides={"llama.threads": 1})


def test_the_configuration_page_documents_every_key() -> None:
    """Without ROS too (test_parameter_reference.py checks the whole table where the node's parameters import)."""
    text = (REPO / "docs" / "configuration.md").read_text()
    for key in OPTIONS:
        assert f"| `{key}` |" in text, (
            f"docs/configuration.md's table lacks {key}: python -m moss_tts_node.ros.parameter_reference"
        )


def test_a_written_params_file_reads_back_the_same(demo_config: Path, tmp_path: Path) -> None:
    config = load_config(demo_config, overrides={"sampling.seed": 7, "llama.flash_attn": "off"})
    path = tmp_path / "again.yaml"
    write_params_file(path, dict(flatten(config)), "first line\n\nthird line")
    assert path.read_text().startswith("# first line\n#\n# third line\nmoss_tts_node:\n  ros__parameters:\n")
    assert load_config(path) == config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"llama.n_ctx": 0}, r"'llama\.n_ctx' must be >= 64, got 0"),
        ({"llama.n_batch": -1}, r"'llama\.n_batch' must be >= 1"),
        ({"llama.kv_cache_type_k": "q3_k"}, r"'llama\.kv_cache_type_k' must be one of f32, f16"),
        ({"llama.flash_attn": "yes"}, r"'llama\.flash_attn' must be one of auto, on, off"),
        (
            {"llama.kv_cache_type_v": "q8_0", "llama.flash_attn": "off"},
            r"'llama\.kv_cache_type_v' q8_0 \(quantized\) needs flash attention: set 'llama\.flash_attn'",
        ),
    ],
)
def test_llama_values_are_refused_with_their_key(demo_config: Path, overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(demo_config, overrides=overrides)


def test_the_stream_decoder_key_takes_auto_off_or_an_existing_graph(demo_config: Path, tmp_path: Path) -> None:
    weights = demo_config.parent
    codec_dir = weights / "codec"
    assert not (codec_dir / STREAM_DECODER_FILE).exists()
    assert stream_decoder_path(load_config(demo_config)) is None  # auto, nothing built: the windowed scheme
    for word in STREAM_DECODER_MODES:  # words, not paths relative to the file
        assert load_config(demo_config, overrides={"audio.stream_decoder": word}).audio.stream_decoder == word
    with pytest.raises(ConfigError, match=r"'audio\.stream_decoder' file not found: .*build-stream-decoder"):
        load_config(demo_config, overrides={"audio.stream_decoder": str(tmp_path / "absent.onnx")})

    graph = tmp_path / "graphs" / "stream.onnx"  # only its existence is checked here; the synthesizer loads it
    graph.parent.mkdir()
    graph.write_bytes(b"")
    params = demo_paths(demo_config) | {"audio.stream_decoder": "graphs/stream.onnx"}
    write_params_file(tmp_path / "params.yaml", params)
    config = load_config(tmp_path / "params.yaml")  # a relative path is taken from the file's folder
    assert stream_decoder_path(config) == graph
    low_memory = load_config(tmp_path / "params.yaml", overrides={"model.low_memory": True})
    assert stream_decoder_path(low_memory) is None  # it never streams


def test_auto_finds_the_stream_decoder_beside_the_codec_graphs(demo_config: Path, tmp_path: Path) -> None:
    codec_dir = linked_copy(demo_config.parent / "codec", tmp_path)
    (codec_dir / STREAM_DECODER_FILE).write_bytes(b"")
    overrides = {"model.codec_dir": str(codec_dir)}
    assert stream_decoder_path(load_config(demo_config, overrides)) == codec_dir / STREAM_DECODER_FILE
    off = load_config(demo_config, overrides | {"audio.stream_decoder": "off"})
    assert stream_decoder_path(off) is None
