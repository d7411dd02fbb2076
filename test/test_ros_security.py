"""docs/security.md over real DDS: what a client on the robot's network can and cannot make the node do.

The node and its clients are separate processes in one loopback-only network namespace, as in
test_ros_node.py; the clients here (ros_helpers/security_client.py) probe the files of the machine, send
oversized and hostile requests, and check that nothing holds the executor. The SROS2 policy is turned into
keystore artifacts by the real ``ros2 security`` and compared with the node's graph.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from xml.etree import ElementTree

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ros_helpers import require_ros
from ros_helpers.netns import SECURITY_CLIENT, LoopbackNamespace, NodeProcess, playing, serving

from moss_tts_node.codec.audio_io import write_wav
from moss_tts_node.config import flatten, load_config, write_params_file
from moss_tts_node.model.rates import FRAMES_PER_SECOND, SAMPLE_RATE

if TYPE_CHECKING:
    from conftest import NullSink

require_ros()

ROOT = Path(__file__).resolve().parent.parent
POLICY = ROOT / "policies" / "moss_tts.policy.xml"
ABORTED = 6  # action_msgs/GoalStatus
UNKNOWN_VOICE = "is not a voice of this node: "
LISTED = "`ros2 service call /moss_tts_node/list_voices moss_tts_msgs/srv/ListVoices`"
LONG = {"sampling.text_temperature": 0.0, "generation.max_new_tokens": 8000}  # the demo model runs on
VIAS = ("synthesize", "speak")


def secure(netns: LoopbackNamespace, command: str, **args: Any) -> Any:
    return netns.client(command, script=SECURITY_CLIENT, **args)


@pytest.fixture(scope="module")
def voice_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The owner's voice directory: a clip with its transcript and a .npy of codes, a folder that links to /etc, and
    a README."""
    folder = tmp_path_factory.mktemp("voices")
    t = np.arange(SAMPLE_RATE) / SAMPLE_RATE
    write_wav(folder / "nurse.wav", 0.3 * np.sin(2 * np.pi * 220 * t), SAMPLE_RATE)  # 1 s: 13 frames
    (folder / "nurse.txt").write_text("Good morning.")
    np.save(folder / "butler.npy", np.random.default_rng(1).integers(0, 1024, (25, 32)))
    (folder / "etc").symlink_to("/etc")
    (folder / "README.txt").write_text("the robot's voices")
    return folder.resolve()  # as the node's configuration resolves it: a client's path is matched against that text


@pytest.fixture(scope="module")
def guide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A voice listed by file, outside every voice directory."""
    path = tmp_path_factory.mktemp("guide") / "guide.npy"
    np.save(path, np.random.default_rng(2).integers(0, 1024, (40, 32)))
    return path


@pytest.fixture(scope="module")
def voices_params(demo_config: Path, voice_dir: Path, guide: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The node's params file here: the voices of ``voice_dir`` and ``guide``, butler the default."""
    values: dict[str, Any] = dict(flatten(load_config(demo_config)))
    values |= {
        "llama.n_threads": 1,
        "generation.max_new_tokens": 60,
        "generation.reference_audio": str(voice_dir / "butler.npy"),
        "voices.files": [str(guide)],
        "voices.directories": [str(voice_dir)],
    }
    path = tmp_path_factory.mktemp("params") / "node.yaml"
    write_params_file(path, values)
    return path


@pytest.fixture(scope="module")
def node(netns: LoopbackNamespace, voices_params: Path) -> Iterator[NodeProcess]:
    with serving(netns, ["--params-file", str(voices_params), "-p", "queue_size:=2"]) as up:
        yield up


def synthesize(netns: LoopbackNamespace, *requests: dict[str, Any]) -> list[dict[str, Any]]:
    return secure(netns, "requests", requests=[{"via": "synthesize", **r} for r in requests])["answers"]


# -- voices ---------------------------------------------------------------------------------------------


def test_the_voices_are_listed_with_what_each_is(netns: LoopbackNamespace, node: NodeProcess) -> None:
    listing = secure(netns, "voices")
    assert (listing["success"], listing["message"]) == (True, "")
    assert listing["voices"] == [
        {
            "name": "butler",
            "kind": "codes",
            "duration": 25 / FRAMES_PER_SECOND,
            "is_default": True,
            "has_transcript": False,
        },
        {
            "name": "guide",
            "kind": "codes",
            "duration": 40 / FRAMES_PER_SECOND,
            "is_default": False,
            "has_transcript": False,
        },
        {
            "name": "nurse",
            "kind": "clip",
            "duration": 13 / FRAMES_PER_SECOND,
            "is_default": False,
            "has_transcript": True,
        },
    ]


def test_a_request_names_its_voice(netns: LoopbackNamespace, node: NodeProcess, voice_dir: Path) -> None:
    """By name, in voice or (an old client) reference_audio, or by the path of a voice directory's file; the
    prompt holds that voice's frames (its slot rows), the default's when none is named."""
    asked = [
        {"voice": "guide"},
        {"voice": "nurse"},
        {"reference_audio": "nurse"},
        {"reference_audio": str(voice_dir / "nurse.wav")},
        {"voice": "nurse", "reference_audio": "nurse"},
        {},  # the default: butler
        {"voice": "butler"},
    ]
    answers = secure(netns, "requests", requests=[{"via": "speak", "text": "Hello.", **a} for a in asked])["answers"]
    assert all(a["success"] for a in answers), answers
    rows = [a["prompt_rows"] for a in answers]
    assert rows[1] == rows[2] == rows[3] == rows[4] == rows[0] - (40 - 13)  # nurse: 13 frames, guide: 40
    assert rows[5] == rows[6] == rows[0] - (40 - 25)


def test_no_file_outside_the_voices(netns: LoopbackNamespace, node: NodeProcess, voice_dir: Path, guide: Path) -> None:
    """Paths to the machine's files, escapes, a link out of the voice directory, a missing file, a voice listed
    by file (named, not by path): one and the same reply, whether the file exists or not, and none is opened."""
    (voice_dir / "shadow.wav").symlink_to("/etc/shadow")  # a link made after the node loaded its voices
    escape = os.path.relpath("/etc/shadow", Path.cwd())  # relative to the working directory: the node's too
    probes = [
        "/etc/passwd",
        "/etc/shadow",
        "/proc/self/environ",
        "../" * 12 + "etc/shadow",
        escape,
        f"{voice_dir}/../../../../../../etc/shadow",
        str(voice_dir / "etc" / "passwd"),
        str(voice_dir / "shadow.wav"),
        str(voice_dir / "README.txt"),
        str(voice_dir / "absent.wav"),
        "/nonexistent/voice.wav",
        str(guide),
        "x/" * 3000,
    ]
    fields = ("voice", "reference_audio")
    requests = [{"via": via, "text": "Hello.", field: probe} for probe in probes for field in fields for via in VIAS]
    try:
        answers = secure(netns, "requests", requests=requests)["answers"]
    finally:
        (voice_dir / "shadow.wav").unlink()  # a node started later would refuse to load such a directory
    assert not any(a["success"] for a in answers)
    quoted = re.compile(r"^(voice|reference_audio) '[^']+' is not a voice")
    assert {quoted.sub(r"\1 '...' is not a voice", a["message"]) for a in answers} == {
        f"{field} '...' {UNKNOWN_VOICE}give one of the names that {LISTED} lists or the path of a file in one of its "
        "voice directories"
        for field in fields
    }
    assert {a["status"] for a in answers if "status" in a} == {ABORTED}
    log = node.output()
    assert "Error opening" not in log and "Format not recognised" not in log


def test_the_new_voice_fields_take_names_only(
    netns: LoopbackNamespace, node: NodeProcess, voice_dir: Path, guide: Path
) -> None:
    """voices and prefix_voice take a name of the library, never a path, not even a voice directory's file's (which
    voice and reference_audio take): each refusal quotes what was given and says nothing else of it, so it reads
    the same whether a file of that name exists or not, and nothing is opened."""
    probes = [
        "/etc/passwd",
        "/proc/self/environ",
        "../" * 12 + "etc/shadow",
        str(voice_dir / "nurse.wav"),
        str(voice_dir / "absent.wav"),
        str(voice_dir / "nurse"),
        str(guide),
        "x/" * 3000,
    ]
    asked = [{"voices": [probe]} for probe in probes] + [{"voices": ["nurse", probe]} for probe in probes]
    asked += [{"prefix_voice": probe} for probe in probes]
    requests = [{"via": via, "text": "Hello.", **fields} for fields in asked for via in VIAS]
    answers = secure(netns, "requests", requests=requests)["answers"]
    assert not any(a["success"] for a in answers)
    quoted = re.compile(r"^(voices\[[01]\]|prefix_voice) '[^']+' is not a voice")
    assert {quoted.sub(r"\1 '...' is not a voice", a["message"]) for a in answers} == {
        f"{field} '...' {UNKNOWN_VOICE}give one of the names that {LISTED} lists (a name, never a path)"
        for field in ("voices[0]", "voices[1]", "prefix_voice")
    }
    log = node.output()
    assert "Error opening" not in log and "Format not recognised" not in log


def test_paths_are_refused_unless_the_owner_allows_a_directory(
    own_netns: LoopbackNamespace, demo_config: Path, voice_dir: Path, tmp_path: Path
) -> None:
    values: dict[str, Any] = dict(flatten(load_config(demo_config))) | {"voices.files": [str(voice_dir / "nurse.wav")]}
    params = tmp_path / "files_only.yaml"
    write_params_file(params, values)
    with serving(own_netns, ["--params-file", str(params)], name="files_only"):
        answers = synthesize(
            own_netns,
            {"text": "Hello.", "voice": "nurse"},
            {"text": "Hello.", "reference_audio": str(voice_dir / "nurse.wav")},  # the very file, by path
            {"text": "Hello.", "reference_audio": "/etc/passwd"},
        )
    assert answers[0]["success"], answers[0]
    # the very file is refused as /etc/passwd is, quoted: no voice directory, so no path names a voice
    quoted = re.compile(r"^reference_audio '[^']+' is not a voice")
    assert {quoted.sub("reference_audio '...' is not a voice", a["message"]) for a in answers[1:]} == {
        f"reference_audio '...' {UNKNOWN_VOICE}give one of the names that {LISTED} lists (a name, never a path)"
    }


# -- bounded requests -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        (
            {"text": "a" * 2001},
            "the request has 2001 characters (text, language, instruction, quality, prefix_text, sound_event, "
            "ambient_sound and scene together), more than the 2000 of 'limits.max_text_chars'",
        ),
        ({"text": "Hello.", "instruction": "calm " * 400}, "'limits.max_text_chars'"),
        ({"text": "Hello.", "scene": "a kitchen " * 100, "ambient_sound": "rain " * 300}, "'limits.max_text_chars'"),
        ({"text": "Hello.", "prefix_voice": "nurse", "prefix_text": "x" * 2000}, "'limits.max_text_chars'"),
        ({"text": "Hello.", "tokens": 1_000_001}, "the request's tokens must be a whole number from 1 to 1000000"),
        ({"text": "Hello.", "voices": ["nurse"] * 6}, "the request gives 6 voices: give 1 to 5"),
        ({"text": "Hello.", "voices": ["nurse"], "voice": "guide"}, "the request gives 'voices' and a voice in"),
        ({"text": "Hello.", "prefix_text": "Good evening."}, "prefix_text but no prefix (prefix_voice over ROS"),
        ({"text": "Hello.", "prefix_voice": "butler"}, "prefix_voice 'butler' has no transcript"),
        ({"text": "Hello.", "seed": -5}, "the seed must be -1 (use sampling.seed) or a number from 0 to"),
        ({"text": "🤖🤖🤖"}, "nothing to say: "),
        ({"text": "... !!! ???"}, "nothing to say: "),
        ({"text": "Hello.", "voice": "nurse", "reference_audio": "butler"}, "the request gives two voices"),
    ],
)
def test_bad_requests_are_refused_naming_the_limit(
    netns: LoopbackNamespace, node: NodeProcess, fields: dict[str, Any], reason: str
) -> None:
    answers = secure(netns, "requests", requests=[{"via": via, **fields} for via in ("synthesize", "speak")])["answers"]
    for answer in answers:
        assert not answer["success"] and reason in answer["message"], answer


def test_a_text_with_nothing_to_say_on_the_topic_is_logged_and_counted(
    netns: LoopbackNamespace, node: NodeProcess
) -> None:
    before = int(netns.client("diagnostics")["values"]["requests_refused"])
    netns.client("text", texts=["🤖🤖🤖", "Hello."], finals=1)
    assert "~/text request refused: nothing to say: " in node.output()
    assert int(netns.client("diagnostics")["values"]["requests_refused"]) == before + 1


def test_a_response_holds_at_most_max_response_seconds(own_netns: LoopbackNamespace, voices_params: Path) -> None:
    """Refused when the text is expected to take longer; cut there when the model runs on (greedy text)."""
    greedy = [f"{key}:={value}" for key, value in {**LONG, "max_response_seconds": 2.0}.items()]
    with serving(own_netns, ["--params-file", str(voices_params), *(a for p in greedy for a in ("-p", p))]):
        long_text, runs_on = synthesize(own_netns, {"text": "Hello there, robot. " * 12}, {"text": "Hi.", "seed": 3})
    assert not long_text["success"] and "parameter 'max_response_seconds' (2 s)" in long_text["message"]
    assert runs_on["success"] and runs_on["stop_reason"] == "max_new_tokens", runs_on
    assert 1.5 < runs_on["duration"] <= 2.0


def test_no_client_can_raise_a_limit(netns: LoopbackNamespace, node: NodeProcess) -> None:
    limits = [
        ["limits.max_text_chars", 10**6],
        ["limits.max_reference_seconds", 600.0],
        ["max_response_seconds", 3600.0],
    ]
    verdicts = netns.client("params", set=limits)["set"]
    assert [v["successful"] for v in verdicts] == [False] * 3 and all("read-only" in v["reason"] for v in verdicts)
    assert netns.client("params", get=["limits.max_text_chars"])["values"] == {"limits.max_text_chars": 2000}


# -- the executor is never held -----------------------------------------------------------------------------------


def test_a_long_check_holds_nothing_up(own_netns: LoopbackNamespace, voices_params: Path) -> None:
    """With a limit far above the default, a text takes seconds to check: meanwhile a parameter change, a bad
    request, a goal's acceptance and its cancel are answered and diagnostics go on, all before that text
    speaks (event order, not time)."""
    limits = ["-p", "limits.max_text_chars:=400000", "-p", "generation.max_new_tokens:=33"]
    with serving(own_netns, ["--params-file", str(voices_params), *limits]):
        answer = secure(own_netns, "order", unit="你好。", times=100_000)  # 300,000 characters: seconds of checking
    first_chunk = answer["first_chunk"]
    assert set(answer["answered"]) == {"parameter", "bad request", "goal accepted", "cancel"}
    assert all(answer["sent"] < at < first_chunk for at in answer["answered"].values()), answer
    assert "the seed must be -1" in answer["bad_request"]
    assert answer["diagnostics"], answer  # published while the text was being checked


# -- fuzzing the node's checks -------------------------------------------------------------------------------------

# What crosses DDS: UTF-8 strings (no lone surrogates), cut at a NUL byte; RTL marks, controls, CJK, emoji, brackets.
WIRE = st.characters(exclude_categories=("Cs",), exclude_characters="\x00")
HOSTILE = ["\u200f", "\u202e", "\u200b", "\x1b", "\ufffd", "🤖", "。", "【", "】", "a", "你", " ", "\n", ".", "/"]
node_texts = st.one_of(
    st.text(WIRE, max_size=200),
    st.text(st.sampled_from(HOSTILE), max_size=2010),
    st.builds(lambda char, n: char * n, WIRE, st.integers(1, 2010)),
)
# Names for voices and prefix_voice: the library's (nurse has a transcript, butler and guide none), near misses, paths.
voice_names = st.sampled_from(["", "nurse", "guide", "butler", "Nurse", "nurse.wav", "/etc/passwd", "../x"]) | st.text(
    WIRE, max_size=20
)
node_requests = st.fixed_dictionaries(
    {"via": st.sampled_from(["synthesize", "speak"]), "text": node_texts},
    optional={
        "language": st.sampled_from(["", "en", "zh", "fr", "\u200f"]) | st.text(WIRE, max_size=10),
        "instruction": st.text(WIRE, max_size=40),
        "voice": st.sampled_from(["", "nurse", "Butler", "/etc/passwd", "../../etc/x"]) | st.text(WIRE, max_size=20),
        "reference_audio": st.sampled_from(["", "guide", "/proc/self/environ"]),
        "seed": st.integers(-(2**63), 2**63 - 1),
        "voices": st.lists(voice_names, max_size=7),
        "prefix_voice": voice_names,
        "prefix_text": st.text(WIRE, max_size=40),
        "sound_event": st.text(WIRE, max_size=40),
        "ambient_sound": st.text(WIRE, max_size=40),
        "quality": st.text(WIRE, max_size=10),
        "scene": node_texts,
        "tokens": st.integers(0, 60) | st.integers(0, 2**32 - 1),
    },
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(node_requests, min_size=10, max_size=20))
def test_fuzzed_requests_are_answered_with_a_reason_or_spoken(
    netns: LoopbackNamespace, node: NodeProcess, requests: list[dict[str, Any]]
) -> None:
    answers = secure(netns, "requests", requests=requests, timeout=120)["answers"]
    for request, answer in zip(requests, answers, strict=True):
        assert answer["success"] or answer["message"], (request, answer)
        assert not answer["success"] or answer["duration"] > 0 or answer["stop_reason"] == "end", (request, answer)
    assert node.process.poll() is None and "Traceback" not in node.output()


# -- SROS2 ---------------------------------------------------------------------------------------------------------


def ros2(netns: LoopbackNamespace, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real ``ros2`` command line, in the namespace (it is a ROS process like any other)."""
    if shutil.which("ros2", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("the ros2 CLI is not installed: `make test` installs it from ../shared/ros2cli/ (with sros2)")
    return netns.ros2(*args, cwd=cwd)


def granted(permissions: Path) -> dict[str, set[str]]:
    """The DDS topics a permissions file lets its enclave publish and subscribe to (its first allow rule)."""
    rule = ElementTree.parse(permissions).getroot().find("permissions/grant/allow_rule")
    assert rule is not None
    return {kind: {t.text or "" for t in rule.findall(f"{kind}/topics/topic")} for kind in ("publish", "subscribe")}


def used(graph: dict[str, list[str]]) -> dict[str, set[str]]:
    """The DDS topics a node's graph uses: topics as rt/..., a service server's requests and replies."""
    return {
        "publish": {f"rt{t}" for t in graph["publish"]}
        | {f"rr{s}Reply" for s in graph["services"]}
        | {f"rq{s}Request" for s in graph["clients"]},
        "subscribe": {f"rt{t}" for t in graph["subscribe"]}
        | {f"rq{s}Request" for s in graph["services"]}
        | {f"rr{s}Reply" for s in graph["clients"]},
    }


# In the policy for nodes elsewhere, not used by this one here: the audio_common topics (where audio_common_msgs
# is not installed), /clock (read with use_sim_time), /parameter_events (which an rclpy node only writes here).
NOT_USED_HERE = {
    "publish": {f"rt/moss_tts_node/audio_common/{name}" for name in ("audio", "audio_stamped", "audio_info")},
    "subscribe": {"rt/clock", "rt/parameter_events"},
}
ENCLAVES = ("client", "node", "operator", "player", "stopper")


@pytest.fixture(scope="module")
def keystore(netns: LoopbackNamespace, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A keystore with the artifacts ``ros2 security generate_artifacts`` makes of the shipped policy."""
    folder = tmp_path_factory.mktemp("sros2")
    created = ros2(netns, "security", "create_keystore", str(folder / "keystore"), cwd=folder)
    assert created.returncode == 0, created.stdout
    made = ros2(netns, "security", "generate_artifacts", "-k", str(folder / "keystore"), "-p", str(POLICY), cwd=folder)
    assert made.returncode == 0, made.stdout
    return folder / "keystore"


def assert_grants_exactly(permissions: Path, graph: dict[str, list[str]], not_used_here: dict[str, set[str]]) -> None:
    grants, uses = granted(permissions), used(graph)
    for kind in ("publish", "subscribe"):
        assert uses[kind] <= grants[kind], (kind, "used, not granted", uses[kind] - grants[kind])
        assert grants[kind] - uses[kind] <= not_used_here[kind], (kind, "granted, not used", grants[kind] - uses[kind])


def test_the_shipped_policy_gives_every_enclave_signed_permissions(keystore: Path) -> None:
    enclaves = keystore / "enclaves" / "moss_tts"
    assert tuple(sorted(p.name for p in enclaves.iterdir())) == ENCLAVES
    for enclave in enclaves.iterdir():
        files = {p.name for p in enclave.iterdir()}
        assert {"cert.pem", "key.pem", "permissions.xml", "permissions.p7s", "governance.p7s"} <= files, enclave
        assert f"<subject_name>CN=/moss_tts/{enclave.name}</subject_name>" in (enclave / "permissions.xml").read_text()
    if shutil.which("openssl") is not None:  # the signature, checked against the keystore's permissions CA
        for enclave in enclaves.iterdir():
            verified = subprocess.run(
                [
                    "openssl",
                    "smime",
                    "-verify",
                    "-in",
                    str(enclave / "permissions.p7s"),
                    "-CAfile",
                    str(keystore / "public" / "permissions_ca.cert.pem"),
                    "-out",
                    "/dev/null",
                ],
                capture_output=True,
                text=True,
            )
            assert verified.returncode == 0, verified.stderr


def test_the_shipped_policy_grants_the_node_exactly_what_it_uses(
    netns: LoopbackNamespace, node: NodeProcess, keystore: Path
) -> None:
    """The node's enclave allows exactly the DDS topics of the topics, services and action its graph shows (and
    the few it uses elsewhere)."""
    graph = secure(netns, "graph", node="moss_tts_node", expect=["/moss_tts_node/list_voices", "/moss_tts_node/speak"])
    assert_grants_exactly(keystore / "enclaves" / "moss_tts" / "node" / "permissions.xml", graph, NOT_USED_HERE)


def test_the_shipped_policy_grants_the_player_exactly_what_it_uses(
    netns: LoopbackNamespace, node: NodeProcess, keystore: Path, null_sink: NullSink, tmp_path: Path
) -> None:
    env = {**netns.env, "PULSE_SERVER": null_sink.env["PULSE_SERVER"]}
    with playing(netns, tmp_path / "player.log", env=env):
        graph = secure(netns, "graph", node="moss_tts_player", expect=["/moss_tts_node/speak/_action/status"])
    not_used = {"publish": set(), "subscribe": {"rt/clock", "rt/parameter_events"}}
    assert_grants_exactly(keystore / "enclaves" / "moss_tts" / "player" / "permissions.xml", graph, not_used)


def test_an_enforced_run_needs_a_fast_dds_with_security(
    own_netns: LoopbackNamespace, voices_params: Path, keystore: Path
) -> None:
    """The node under ROS_SECURITY_ENABLE, with the shipped policy's /moss_tts/node enclave: it serves where Fast
    DDS has its security plugins; the PyPI one has none, and the node then says so and exits 2 (no traceback)."""
    own_netns.env |= {
        "ROS_SECURITY_ENABLE": "true",
        "ROS_SECURITY_STRATEGY": "Enforce",
        "ROS_SECURITY_KEYSTORE": str(keystore),
    }
    process = NodeProcess(own_netns, ["--params-file", str(voices_params), "--enclave", "/moss_tts/node"])
    try:
        process.wait_ready()
        served = True
    except AssertionError:
        served = False
    code = process.stop()
    output = process.output()
    if served:  # a Fast DDS with security: the node runs in its enclave
        assert code == 0, output
    else:
        assert "doesn't have the security libraries" in output, output
        assert code == 2 and "cannot start: " in output and "Traceback" not in output, output
