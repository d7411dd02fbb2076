"""ros/parameters.py without a middleware: what the node declares, when each parameter may change, and the
checks of single values and of a full set (the same rules and messages as a config file)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import pytest
from ros_helpers import parameter_values, require_ros

from moss_tts_node.config import OPTIONS, load_config

require_ros()

from moss_tts_node.errors import ConfigError, RequestError  # noqa: E402
from moss_tts_node.ros.lifecycle import Phase, change_refusal  # noqa: E402
from moss_tts_node.ros.parameters import (  # noqa: E402
    ALL_OPTIONS,
    LOAD_TIME_CONSTRAINT,
    OWNER_KEYS,
    STARTUP_KEYS,
    Settings,
    Startup,
    checked_settings,
    checked_startup,
    checked_values,
    declarations,
    descriptor,
    load_time,
)
from moss_tts_node.ros.text_stream import StreamLimits  # noqa: E402

SOURCE = "moss_tts_node parameters"
# What docs/ros.md, "Parameters", promises may change in any state (`ros2 param set`); the rest but STARTUP is read
# when the model loads, so it changes only while the node is unconfigured (docs/ros.md, "Lifecycle").
LIVE = {
    *(key for key in OPTIONS if key.startswith("sampling.")),
    *(key for key in OPTIONS if key.startswith("generation.") and key != "generation.reference_audio"),
    "audio.chunk_frames",
    "audio.left_context_frames",
    "queue_policy",
    "stop_empties_queue",
    "output_encoding",
    "languages",
}
# Read once, at start: the queue's size, autostart, and the text streams' bounds.
TEXT_STREAM_BOUNDS = ("max_open", "max_chars", "idle_timeout", "max_duration")
STARTUP = {"queue_size", "autostart", *(f"text_stream_{bound}" for bound in TEXT_STREAM_BOUNDS)}


def test_every_config_key_and_node_option_is_declared_once_with_its_default() -> None:
    declared = declarations()
    node_options = ["queue_size", "autostart", "queue_policy", "stop_empties_queue", "output_encoding"]
    node_options += ["text_stream_max_open"]
    node_options += ["text_stream_max_chars", "text_stream_idle_timeout", "text_stream_max_duration"]
    node_options += ["languages", "max_response_seconds"]
    assert [name for name, _, _ in declared] == [*OPTIONS, *node_options]
    for name, default, described in declared:
        assert default == ALL_OPTIONS[name].default
        assert (described.name, described.description) == (name, ALL_OPTIONS[name].doc)
        assert described.dynamic_typing  # checked by check_value, as in a config file


def test_a_parameter_changes_in_any_state_if_read_per_request_and_at_startup_never() -> None:
    assert set(STARTUP_KEYS) == STARTUP
    owner = {name for name in ALL_OPTIONS if name.startswith(OWNER_KEYS)}
    assert {name for name, _, described in declarations() if described.read_only} == STARTUP | owner
    assert {name for name in ALL_OPTIONS if ALL_OPTIONS[name].per_request} - owner == LIVE
    held = {name for name in ALL_OPTIONS if load_time(ALL_OPTIONS[name])}
    assert held == set(ALL_OPTIONS) - LIVE - STARTUP - owner
    assert {"generation.reference_audio", "llama.n_ctx", "model.weights_dir", "audio.backend"} <= held
    for name, _, described in declarations():  # `ros2 param describe` says when a load-time one may change
        assert (LOAD_TIME_CONSTRAINT in described.additional_constraints) is (name in held), name


def test_the_limits_and_the_voices_are_read_only_in_every_state() -> None:
    """Any participant of the domain may set a parameter that is not read-only (and, without SROS2, take the node
    through its lifecycle): it must not raise a limit, nor add a voice directory."""
    limits = [o for o in ALL_OPTIONS.values() if o.key.startswith(("limits.", "max_response_", "text_stream_"))]
    assert len(limits) == 7
    assert all(descriptor(o).read_only for o in limits)
    assert all(descriptor(o).read_only for o in ALL_OPTIONS.values() if o.key.startswith("voices."))


def test_ranges_and_choices_reach_the_descriptor() -> None:
    n_ctx = descriptor(OPTIONS["llama.n_ctx"]).integer_range[0]
    assert (n_ctx.from_value, n_ctx.to_value, n_ctx.step) == (64, 131072, 0)
    seed = descriptor(OPTIONS["sampling.seed"]).integer_range[0]
    assert (seed.from_value, seed.to_value) == (-1, 2**63 - 1)
    top_p = descriptor(OPTIONS["sampling.text_top_p"]).floating_point_range[0]
    assert (top_p.from_value, top_p.to_value, top_p.step) == (-1.0, 1.0, 0.0)  # -1: the model's recommendation
    queue_size = descriptor(ALL_OPTIONS["queue_size"]).integer_range[0]
    assert (queue_size.from_value, queue_size.to_value) == (0, 64)
    assert descriptor(ALL_OPTIONS["queue_policy"]).additional_constraints == "one of: queue, interrupt"
    assert (
        descriptor(OPTIONS["audio.backend"]).additional_constraints == f"one of: onnx, tensorrt; {LOAD_TIME_CONSTRAINT}"
    )
    assert descriptor(ALL_OPTIONS["output_encoding"]).additional_constraints == "one of: pcm_s16le, float32"
    extremes = {int: (-(2**63), 2**63 - 1), float: (-math.inf, math.inf)}
    for option in ALL_OPTIONS.values():
        described = descriptor(option)
        assert described.additional_constraints.startswith("one of: ") is bool(option.choices), option.key
        ranges = [*described.integer_range, *described.floating_point_range]
        if option.type not in extremes or (option.min is None and option.max is None):
            assert not ranges, option.key
            continue
        (bounds,) = ranges
        assert (bounds in described.integer_range) is (option.type is int), option.key
        low, high = extremes[option.type]
        assert bounds.from_value == (low if option.lowest is None else option.lowest), option.key
        assert bounds.to_value == (high if option.max is None else option.max), option.key


def test_a_full_set_of_values_becomes_the_settings(demo_config: Path) -> None:
    settings = checked_settings(
        parameter_values(demo_config, queue_size=2, languages=["en", "zh"], sampling__text_temperature=1),
        SOURCE,
        Path.cwd(),
    )
    expected = load_config(demo_config, {"sampling.text_temperature": 1.0})
    assert settings == Settings(
        expected,
        queue_policy="queue",
        stop_empties_queue=True,
        output_encoding="pcm_s16le",
        languages=("en", "zh"),
        max_response_seconds=120.0,
    )
    assert type(settings.config.sampling.text_temperature) is float  # an int is a float's value, as in a file


def test_relative_paths_are_taken_from_the_base_directory(demo_config: Path) -> None:
    weights = demo_config.parent.resolve()
    settings = checked_settings(parameter_values(demo_config, model__weights_dir=weights.name), SOURCE, weights.parent)
    assert settings.config.model.weights_dir == str(weights)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"queue_policy": "lifo"}, f"{SOURCE}: 'queue_policy' must be one of queue, interrupt, got 'lifo'"),
        ({"sampling__text_temperature": "hot"}, f"{SOURCE}: 'sampling.text_temperature' must be float, got str 'hot'"),
        ({"sampling__text_top_p": 2.0}, f"{SOURCE}: 'sampling.text_top_p' must be <= 1.0, got 2.0"),
        ({"queue_size": 65}, f"{SOURCE}: 'queue_size' must be <= 64, got 65"),
        ({"queue_size": -1}, f"{SOURCE}: 'queue_size' must be >= 0, got -1"),
        ({"output_encoding": "mp3"}, f"{SOURCE}: 'output_encoding' must be one of pcm_s16le, float32, got 'mp3'"),
        ({"languages": "en"}, f"{SOURCE}: 'languages' must be list, got str 'en'"),
        ({"languages": ["en", ""]}, f"{SOURCE}: 'languages' must be a list of language codes or names, got ['en', '']"),
        ({"languages": [1]}, f"{SOURCE}: 'languages' must be a list of language codes or names, got [1]"),
        ({"languages": ["en", "klingon"]}, f"{SOURCE}: 'languages': unknown language 'klingon': give one of the codes"),
        ({"model__weights_dir": "/nowhere"}, f"{SOURCE}: 'model.weights_dir' directory not found: /nowhere"),
        (
            {"llama__kv_cache_type_v": "q8_0", "llama__flash_attn": "off"},
            f"{SOURCE}: 'llama.kv_cache_type_v' q8_0 (quantized) needs flash attention",
        ),
    ],
)
def test_bad_values_are_refused_with_the_config_files_messages(
    demo_config: Path, changes: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        checked_settings(parameter_values(demo_config, **changes), SOURCE, Path.cwd())
    assert str(refused.value).startswith(message)


def test_the_languages_parameter_bounds_what_a_request_may_ask_for(demo_config: Path) -> None:
    settings = checked_settings(parameter_values(demo_config, languages=["en", "Chinese", "zh"]), SOURCE, Path.cwd())
    assert settings.languages == ("en", "zh")  # codes, each once, whatever spelling the parameter used
    settings.check_language("zh")
    settings.check_language("english")  # a name stands for its code
    settings.check_language(None)  # generation.language, whatever it is
    with pytest.raises(RequestError, match="unknown language 'xx': give one of the codes"):
        settings.check_language("xx")
    with pytest.raises(RequestError) as refused:
        settings.check_language("fr")
    assert str(refused.value) == "unknown language 'fr': this node accepts en, zh (parameter 'languages')"
    checked_settings(parameter_values(demo_config), SOURCE, Path.cwd()).check_language("fr")  # empty: any


def test_the_startup_parameters_are_checked_on_their_own(demo_config: Path) -> None:
    values = parameter_values(demo_config, queue_size=3, autostart=False, model__weights_dir="/nowhere")
    startup = checked_startup(values, SOURCE)  # whatever else is wrong
    assert startup == Startup(
        queue_size=3,
        autostart=False,
        text_stream_max_open=4,
        text_stream_max_chars=20000,
        text_stream_idle_timeout=10.0,
        text_stream_max_duration=300.0,
    )
    assert startup.text_stream_limits == StreamLimits(4, 20000, 10.0, 300.0)
    with pytest.raises(ConfigError, match=re.escape(f"{SOURCE}: 'text_stream_idle_timeout' must be >= 0.1, got 0.0")):
        checked_startup(
            parameter_values(demo_config, text_stream_idle_timeout=0.0), SOURCE
        )  # at start, not at a stream
    with pytest.raises(ConfigError, match=re.escape(f"{SOURCE}: 'queue_size' must be <= 64, got 65")):
        checked_startup(parameter_values(demo_config, queue_size=65), SOURCE)
    with pytest.raises(ConfigError, match=re.escape(f"{SOURCE}: 'autostart' must be bool, got str 'no'")):
        checked_startup(parameter_values(demo_config, autostart="no"), SOURCE)


def test_single_values_are_checked_alone_and_the_files_with_the_whole_set(demo_config: Path) -> None:
    """What an unconfigured node checks when a parameter is set: the value's type, range and choices; whether
    the files it names are there is for the whole set, at configure (so wrong values are fixed one by one)."""
    alone = {"model.weights_dir": "/nowhere", "languages": ["English", "zh"], "sampling.text_temperature": 1}
    assert checked_values(alone, SOURCE) == alone | {"languages": ("en", "zh"), "sampling.text_temperature": 1.0}
    with pytest.raises(ConfigError, match=re.escape(f"{SOURCE}: 'llama.n_ctx' must be >= 64, got 10")):
        checked_values({"llama.n_ctx": 10}, SOURCE)
    with pytest.raises(ConfigError, match=re.escape("'model.weights_dir' directory not found: /nowhere")):
        checked_settings(parameter_values(demo_config) | alone, SOURCE, Path.cwd())


def test_a_change_is_checked_alone_while_unconfigured_and_with_the_whole_set_once_loaded(demo_config: Path) -> None:
    """What the node answers ``ros2 param set``: a load-time key waits for an unconfigured node; then, with no model
    loaded, the value alone (a missing file is for the configure to find), with one the whole set as it would be."""
    now = parameter_values(demo_config)
    node = "/moss_tts_node"
    assert change_refusal({"model.weights_dir": "/nowhere"}, now, Phase.UNCONFIGURED, node, SOURCE) is None
    assert change_refusal({"llama.n_ctx": 10}, now, Phase.UNCONFIGURED, node, SOURCE) == (
        f"{SOURCE}: 'llama.n_ctx' must be >= 64, got 10"
    )
    held = change_refusal({"llama.n_ctx": 4096}, now, Phase.ACTIVE, node, SOURCE)
    assert held is not None and held.startswith("'llama.n_ctx' is read when the model loads")
    assert change_refusal({"sampling.seed": 3}, now, Phase.ACTIVE, node, SOURCE) is None
    missing = now | {"model.weights_dir": "/nowhere"}  # a whole set that no longer holds: every change is refused
    assert "'model.weights_dir' directory not found" in (
        change_refusal({"sampling.seed": 3}, missing, Phase.INACTIVE, node, SOURCE) or ""
    )
