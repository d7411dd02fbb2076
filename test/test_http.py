"""The speech server over real HTTP, with clients nobody here wrote: the official ``openai`` package and curl.

The server (``python -m moss_tts_node serve``) and its clients run in one loopback-only network namespace
(ros_helpers/netns.py), on the demo model speaking through codec-tiny with its stream decoder, so that a streamed
body is the codec's exact decode and equals a whole one; and on MOSS-TTS-Nano's demo, whose 48 kHz stereo the
bodies carry as it is, or converted as the server's audio.output_* keys ask.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import soxr
from ros_helpers import node_params_file
from ros_helpers.netns import LoopbackNamespace, loopback_namespace, stop_process, wait_for_line

pytest.importorskip("starlette", reason="the [http] extra is not installed: pip install -r requirements-http.txt")
pytest.importorskip("openai", reason="the openai client is not installed: pip install -r requirements-http.txt")

from moss_tts_node.http.server import LISTENING_LINE
from moss_tts_node.model.rates import SAMPLE_RATE

CLIENT = Path(__file__).resolve().parent / "http_helpers" / "client.py"
PORT = 8000
BASE_URL = f"http://127.0.0.1:{PORT}/v1"
MODEL = "MOSS-TTS"
TEXT = "Hello from the robot."
LONG_TEXT = " ".join(["The robot keeps talking about the weather, the sea and the stars."] * 12)


@pytest.fixture(scope="module")
def http_config(demo_config: Path, codec_tiny_streaming_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model speaking through codec-tiny with its stream decoder (a stream is the offline decode), a voice
    directory (butler.npy with its transcript, guide.npy) and one llama thread, as a params file."""
    folder = tmp_path_factory.mktemp("http")
    codec_dir = codec_tiny_streaming_dir
    voices = folder / "voices"
    voices.mkdir()
    codes = np.random.default_rng(0).integers(0, 1024, size=(20, 32))
    np.save(voices / "butler.npy", codes)
    np.save(voices / "guide.npy", codes[::-1].copy())
    (voices / "butler.txt").write_text("Good evening, sir.", encoding="utf-8")
    values = {"llama.n_threads": 1, "model.codec_dir": str(codec_dir), "voices.directories": [str(voices)]}
    return node_params_file(demo_config, folder / "server.yaml", **values)


class Server:
    """``python -m moss_tts_node serve`` in a namespace, its output in a log file."""

    def __init__(self, netns: LoopbackNamespace, config: Path, *args: str, name: str = "server") -> None:
        self.log = netns.log_dir / f"{name}.log"
        with self.log.open("w") as out:
            self.process = netns.popen(
                [sys.executable, "-m", "moss_tts_node", "serve", "--config", str(config), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text()

    def wait_ready(self) -> None:
        wait_for_line(self.output, LISTENING_LINE, lambda: self.process.poll() is None, "the server", 120.0)

    def stop(self) -> int:
        """Ctrl-C, and the exit code."""
        code = stop_process(self.process)
        if code is None:
            raise AssertionError(f"the server did not stop within 30 s:\n{self.output()[-3000:]}")
        return code


@pytest.fixture(scope="module")
def http_netns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackNamespace]:
    ns = loopback_namespace(tmp_path_factory.mktemp("http-netns"))
    yield ns
    ns.close()


@pytest.fixture(scope="module")
def server(http_netns: LoopbackNamespace, http_config: Path) -> Iterator[Server]:
    running = Server(http_netns, http_config, "--port", str(PORT), "--queue-size", "8")
    try:
        running.wait_ready()
        yield running
    finally:
        assert running.stop() == 0, running.output()[-3000:]


def call(netns: LoopbackNamespace, command: str, **args: Any) -> Any:
    return netns.client(command, timeout=300.0, script=CLIENT, **args)


def speech(netns: LoopbackNamespace, out: Path, **fields: Any) -> dict[str, Any]:
    """One openai-client request; ``extra`` fields go in its extra_body."""
    extra = fields.pop("extra", {})
    return call(netns, "openai", base_url=BASE_URL, model=MODEL, out=str(out), extra_body=extra, **fields)


def direct_pcm(netns: LoopbackNamespace, out: Path, seed: int) -> Path:
    """The server's own streamed PCM of TEXT in the voice 'guide' at ``seed``: what a remote backend must pass on."""
    answer = speech(netns, out, streamed=True, input=TEXT, voice="guide", response_format="pcm", extra={"seed": seed})
    assert answer["status"] == 200
    return out


def pcm_samples(path: Path) -> np.ndarray:
    return np.frombuffer(path.read_bytes(), dtype="<i2")


def assert_same_audio(actual: np.ndarray, expected: np.ndarray) -> None:
    """The samples of two requests of one seed: equal, but for a last bit of 16 where llama.cpp's sums differ (a
    request whose prompt prefix the server kept in its KV cache prefills fewer rows, in other batches)."""
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual.astype(np.int32), expected.astype(np.int32), rtol=0, atol=1)


def test_models_and_voices_are_listed(server: Server, http_netns: LoopbackNamespace) -> None:
    models = call(http_netns, "raw", method="GET", path="/v1/models")
    assert models["status"] == 200
    assert [model["id"] for model in models["json"]["data"]] == [MODEL]
    voices = call(http_netns, "raw", method="GET", path="/v1/audio/voices")
    listed = {voice["name"]: voice for voice in voices["json"]["voices"]}
    assert sorted(listed) == ["butler", "guide"]
    assert listed["butler"]["has_transcript"] and not listed["guide"]["has_transcript"]
    assert listed["butler"]["duration"] == pytest.approx(20 / 12.5)
    health = call(http_netns, "raw", method="GET", path="/health")
    assert (health["status"], health["json"]) == (200, {"status": "ok"})


def test_the_openai_client_gets_speech_as_wav(server: Server, http_netns: LoopbackNamespace, tmp_path: Path) -> None:
    answer = speech(http_netns, tmp_path / "hello.wav", input=TEXT, response_format="wav", extra={"seed": 1})
    assert answer["status"] == 200, answer
    assert answer["headers"]["content-type"] == "audio/wav"
    audio, rate = sf.read(tmp_path / "hello.wav", dtype="int16")
    assert rate == SAMPLE_RATE and audio.ndim == 1 and audio.size > SAMPLE_RATE // 10
    assert np.abs(audio).max() > 0


def test_the_streamed_pcm_equals_the_whole_responses_samples(
    server: Server, http_netns: LoopbackNamespace, tmp_path: Path
) -> None:
    """The same request (a seed) read piece by piece as it streams, read whole, and made whole by the server
    (stream false: the codec's offline decode) gives the same samples; WAV and FLAC hold them too."""
    fields: dict[str, Any] = {"input": TEXT, "voice": "guide"}
    streamed = speech(
        http_netns, tmp_path / "streamed.pcm", streamed=True, response_format="pcm", extra={"seed": 2}, **fields
    )
    assert streamed["status"] == 200 and streamed["headers"]["content-type"] == "audio/pcm", streamed
    read_whole = speech(http_netns, tmp_path / "whole.pcm", response_format="pcm", extra={"seed": 2}, **fields)
    offline = speech(
        http_netns, tmp_path / "offline.pcm", response_format="pcm", extra={"seed": 2, "stream": False}, **fields
    )
    flac = speech(
        http_netns, tmp_path / "offline.flac", response_format="flac", extra={"seed": 2, "stream": False}, **fields
    )
    wav = speech(
        http_netns, tmp_path / "streamed.wav", streamed=True, response_format="wav", extra={"seed": 2}, **fields
    )
    assert [answer["status"] for answer in (read_whole, offline, flac, wav)] == [200] * 4
    samples = pcm_samples(tmp_path / "streamed.pcm")
    assert samples.size > SAMPLE_RATE // 10 and np.abs(samples).max() > 0
    assert_same_audio(pcm_samples(tmp_path / "whole.pcm"), samples)
    assert_same_audio(pcm_samples(tmp_path / "offline.pcm"), samples)
    flac_samples, rate = sf.read(tmp_path / "offline.flac", dtype="int16")
    assert rate == SAMPLE_RATE
    assert_same_audio(flac_samples, pcm_samples(tmp_path / "offline.pcm"))
    wav_bytes = (tmp_path / "streamed.wav").read_bytes()
    assert wav_bytes[:4] == b"RIFF" and wav_bytes[8:16] == b"WAVEfmt "
    assert_same_audio(np.frombuffer(wav_bytes[44:], dtype="<i2"), samples)
    wav_samples, _ = sf.read(io.BytesIO(wav_bytes), dtype="int16")  # libsndfile reads a stream's header
    np.testing.assert_array_equal(wav_samples, np.frombuffer(wav_bytes[44:], dtype="<i2"))


def test_curl_gets_speech(server: Server, http_netns: LoopbackNamespace, tmp_path: Path) -> None:
    out = tmp_path / "curl.mp3"
    body = json.dumps({"model": MODEL, "input": TEXT, "voice": "butler", "seed": 3})
    curl = http_netns.popen(
        [
            "curl",
            "-sS",
            "--fail-with-body",
            "-o",
            str(out),
            "-w",
            "%{http_code} %{content_type}",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
            f"{BASE_URL}/audio/speech",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    printed, errors = curl.communicate(timeout=300)
    assert curl.returncode == 0, errors
    assert printed == "200 audio/mpeg"  # no format named: mp3, as OpenAI's API answers
    samples, rate, _ = decoded_audio(out)
    assert rate == SAMPLE_RATE and samples > 0


def test_concurrent_clients_each_get_their_own_speech(
    server: Server, http_netns: LoopbackNamespace, tmp_path: Path
) -> None:
    """Four clients at once are spoken one after another, each its own text: the same samples as alone."""
    inputs = ["One.", "Two, two.", "Three, three, three.", "Four."]
    answers = call(
        http_netns,
        "concurrent",
        base_url=BASE_URL,
        model=MODEL,
        out=str(tmp_path / "c"),
        response_format="pcm",
        inputs=inputs,
        extra_body={"seed": 4},
    )["answers"]
    assert [answer["status"] for answer in answers] == [200] * 4, answers
    alone = speech(http_netns, tmp_path / "alone.pcm", input=inputs[2], response_format="pcm", extra={"seed": 4})
    assert alone["status"] == 200
    assert_same_audio(pcm_samples(tmp_path / "c.2"), pcm_samples(tmp_path / "alone.pcm"))
    assert len({(tmp_path / f"c.{i}").read_bytes() for i in range(4)}) == 4  # each its own text's


HOSTILE = [
    ({"repeat": 200_000, "repeat_char": "a"}, 413, "longer than the"),
    ({"body": "not json"}, 400, "not JSON"),
    ({"body": "[" * 15_000 + "]" * 15_000}, 400, "not JSON"),
    ({"body": json.dumps(["Hello."])}, 400, "must be a JSON object"),
    ({"body": json.dumps({"model": MODEL, "input": 5})}, 400, "'input' must be the text to speak"),
    ({"body": json.dumps({"model": MODEL, "input": "Hi.", "seed": "one"})}, 400, "the seed must be"),
    ({"body": json.dumps({"model": MODEL, "input": "Hi.", "language": ["en"]})}, 400, "language must be a string"),
    ({"body": json.dumps({"model": MODEL, "input": "Hi.", "voice": "../../etc/passwd"})}, 400, "not a voice"),
    ({"body": json.dumps({"model": MODEL, "input": "Hi.", "voice": "/etc/passwd"})}, 400, "(a name, never a path)"),
    ({"body": json.dumps({"model": MODEL, "input": "Hi.", "prefix_voice": "/tmp/x.wav"})}, 400, "not a voice"),
    ({"body": json.dumps({"model": MODEL, "input": "Hi.", "voices": ["butler"] * 6})}, 400, "give 1 to 5"),
    ({"body": json.dumps({"model": MODEL, "input": "Hi.", "voice": "alloy"})}, 400, "'alloy' is not a voice"),
    ({"body": json.dumps({"model": MODEL, "input": "Hi.", "reference_audio": "/etc/passwd"})}, 400, "unknown field"),
    ({"body": json.dumps({"model": MODEL, "input": "Hi.", "response_format": "ogg"})}, 400, "give one of mp3, opus"),
    ({"body": json.dumps({"model": MODEL, "input": "Hi.", "speed": 5.0})}, 400, "from 0.25 to 4"),
    ({"body": json.dumps({"model": "tts-1", "input": "Hi."})}, 404, "is not served here"),
    ({"body": json.dumps({"model": MODEL, "input": "a" * 2001})}, 400, "'limits.max_text_chars'"),
    ({"body": json.dumps({"model": MODEL, "input": "\U0001f600" * 3000})}, 400, "'limits.max_text_chars'"),
    ({"body": json.dumps({"model": MODEL, "input": "!!!"})}, 400, "nothing to say"),
    ({"body": json.dumps({"model": MODEL, "input": "Hi.", "language": "xx"})}, 400, "xx"),
    ({"body": json.dumps({"model": MODEL, "input": "Hi.", "prefix_voice": "guide"})}, 400, "has no transcript"),
    ({"path": "/v1/audio/speech/../../etc", "body": "{}"}, 404, "/etc"),
    ({"method": "GET", "path": "/v1/audio/speech"}, 405, "Method Not Allowed"),
]


@pytest.mark.parametrize(("request_args", "status", "reason"), HOSTILE)
def test_a_hostile_request_gets_openais_error_body(
    server: Server, http_netns: LoopbackNamespace, request_args: dict[str, Any], status: int, reason: str
) -> None:
    headers = {"Content-Type": "application/json"}
    answer = call(http_netns, "raw", headers=headers, **request_args)
    assert answer["status"] == status, answer
    error = answer["json"]["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert reason in error["message"]
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_a_client_that_goes_away_is_cancelled_and_the_next_is_answered(
    server: Server, http_netns: LoopbackNamespace, tmp_path: Path, response_format: str
) -> None:
    """The first bytes of every format leave while its speech goes on: the client has them, drops the rest, and the
    server ends the speech for that, not because it was over."""
    seen = len(server.output())
    answer = call(
        http_netns,
        "disconnect",
        base_url=BASE_URL,
        model=MODEL,
        long_input=LONG_TEXT,
        input=TEXT,
        response_format=response_format,
        out=str(tmp_path / "after.wav"),
    )
    assert answer["first_status"] == 200 and answer["first_bytes"] == 64
    assert answer["after"]["status"] == 200

    def since() -> str:  # this request's lines only: the formats before it were cancelled too
        return server.output()[seen:]

    wait_for_line(since, "ended: the client closed the connection", lambda: True, "the server", 60.0)


def test_a_server_off_loopback_needs_an_api_key(
    http_netns: LoopbackNamespace, http_config: Path, tmp_path: Path
) -> None:
    refused = Server(http_netns, http_config, "--host", "0.0.0.0", "--port", "8001", name="exposed")
    assert refused.process.wait(120) == 2
    assert "give an API key (--api-key-file" in refused.output()
    key = tmp_path / "key"
    key.write_text("s3cret\n")
    keyed = Server(
        http_netns, http_config, "--host", "0.0.0.0", "--port", "8001", "--api-key-file", str(key), name="keyed"
    )
    try:
        keyed.wait_ready()
        url = "http://127.0.0.1:8001/v1"
        none = call(http_netns, "raw", port=8001, method="GET", path="/v1/models")
        wrong = call(
            http_netns, "openai", base_url=url, api_key="guess", model=MODEL, input=TEXT, out=str(tmp_path / "w")
        )
        right = call(
            http_netns, "openai", base_url=url, api_key="s3cret", model=MODEL, input=TEXT, out=str(tmp_path / "r.wav")
        )
    finally:
        assert keyed.stop() == 0
    assert none["status"] == 401 and none["json"]["error"]["code"] == "invalid_api_key"
    assert wrong["status"] == 401
    assert right["status"] == 200 and (tmp_path / "r.wav").stat().st_size > 44


def test_a_full_line_refuses_with_the_reason(http_netns: LoopbackNamespace, http_config: Path, tmp_path: Path) -> None:
    """queue size 0: while one request speaks, another is refused (429, the line's own reason), and served after."""
    alone = Server(http_netns, http_config, "--port", "8002", "--queue-size", "0", name="alone")
    try:
        alone.wait_ready()
        answer = call(
            http_netns,
            "busy",
            port=8002,
            model=MODEL,
            long_input=LONG_TEXT,
            input=TEXT,
            base_url="http://127.0.0.1:8002/v1",
            out=str(tmp_path / "after.wav"),
        )
    finally:
        assert alone.stop() == 0
    assert answer["refused"]["status"] == 429, answer
    assert "the queue is full" in answer["refused"]["error"]["error"]["message"]
    assert answer["after"]["status"] == 200


# -- the remote backend, speaking through this server ------------------------------------------------------------


@pytest.fixture(scope="module")
def remote_config(demo_config: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A params file whose model is the server's (``model.backend: remote``)."""
    values = {"model.backend": "remote", "model.remote_url": BASE_URL}
    return node_params_file(demo_config, tmp_path_factory.mktemp("remote") / "remote.yaml", **values)


def test_the_api_speaks_through_the_remote_backend(
    server: Server, http_netns: LoopbackNamespace, remote_config: Path, tmp_path: Path
) -> None:
    """The same chunks a local stream gives (an empty final one after the server's), the server's voices by name,
    its refusals as RequestError, a cancel that ends the stream."""
    answer = call(
        http_netns,
        "remote",
        config=str(remote_config),
        input=TEXT,
        seed=6,
        long_input=LONG_TEXT,
        out=str(tmp_path / "api.pcm"),
    )
    direct = direct_pcm(http_netns, tmp_path / "direct.pcm", seed=6)
    assert_same_audio(pcm_samples(tmp_path / "api.pcm"), pcm_samples(direct))
    assert answer["name"] == MODEL
    assert answer["voices"] == {"butler": [pytest.approx(1.6), ""], "guide": [pytest.approx(1.6), None]}
    assert answer["finals"][-1] and not any(answer["finals"][:-1]) and len(answer["finals"]) > 2
    assert answer["report"]["stop"] == "end"
    unknown, streamed_text = answer["refusals"]
    assert "the remote server refused the request (400): voice 'nobody' is not a voice of this node" in unknown
    assert "text that arrives in fragments needs the local model" in streamed_text
    assert answer["cancelled"] == "cancelled"


def test_the_cli_speaks_through_the_remote_backend(
    server: Server, http_netns: LoopbackNamespace, remote_config: Path, tmp_path: Path
) -> None:
    """``synth --output`` asks for the server's whole decode: the file holds the samples a client gets."""
    out = tmp_path / "cli.wav"
    cli = http_netns.popen(
        [
            sys.executable,
            "-m",
            "moss_tts_node",
            "synth",
            "--config",
            str(remote_config),
            "--text",
            TEXT,
            "--reference",
            "butler",
            "--seed",
            "8",
            "--output",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    printed, _ = cli.communicate(timeout=300)
    assert cli.returncode == 0, printed
    direct = speech(
        http_netns,
        tmp_path / "direct.pcm",
        input=TEXT,
        voice="butler",
        response_format="pcm",
        extra={"seed": 8, "stream": False},
    )
    assert direct["status"] == 200
    audio, rate = sf.read(out, dtype="int16")
    assert rate == SAMPLE_RATE
    assert_same_audio(audio, pcm_samples(tmp_path / "direct.pcm"))
    refused = http_netns.popen(
        [
            sys.executable,
            "-m",
            "moss_tts_node",
            "synth",
            "--config",
            str(remote_config),
            "--text",
            TEXT,
            "--reference",
            "alloy",
            "--output",
            str(tmp_path / "no.wav"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    printed, _ = refused.communicate(timeout=300)
    assert refused.returncode == 2 and "'alloy' is not a voice of this node" in printed


def test_the_node_speaks_through_the_remote_backend(
    server: Server, http_netns: LoopbackNamespace, remote_config: Path, tmp_path: Path
) -> None:
    """A ROS client unchanged: a Speak goal streams the server's audio into ~/audio, a ~/synthesize call gets the
    whole of it, and a text stream, which the API cannot take, is refused with the reason."""
    from ros_helpers import require_ros
    from ros_helpers.netns import serving

    require_ros()
    with serving(http_netns, ["--params-file", str(remote_config)], name="remote-node") as node:
        spoken = http_netns.client("speak", goals=[{"text": TEXT, "seed": 9, "voice": "guide"}])
        whole = http_netns.client("synthesize", requests=[{"text": TEXT, "seed": 9, "voice": "guide"}])
        steps = [{"chunk": {"stream_id": "s", "text": "Hi. ", "final": True}}, {"wait_refused": 1}]
        http_netns.client("text_stream", steps=steps, finals=[])
        log = node.output()
    goal = spoken["goals"][0]
    assert goal["success"], goal["message"]
    chunks = [chunk for chunk in spoken["chunks"] if chunk["request_id"] == goal["id"]]
    assert chunks[-1]["is_final"] and not any(chunk["is_final"] for chunk in chunks[:-1])
    direct = direct_pcm(http_netns, tmp_path / "direct.pcm", seed=9)
    assert sum(chunk["bytes"] for chunk in chunks) == direct.stat().st_size
    response = whole["responses"][0]
    assert response["success"], response["message"]
    assert response["bytes"] == direct.stat().st_size
    assert "text stream 's' refused: text that arrives in fragments needs the local model" in log


# A server that lists a model and no voices, and answers every speech request 400 with an error body that breaks
# off: a chunked body whose first line is no chunk size.
FAULTY_SERVER = r"""
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Faulty(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        listed = {"data": [{"id": "faulty"}]} if self.path.endswith("/models") else {"voices": []}
        body = json.dumps(listed).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(400)
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"no chunk size\r\n")
        self.close_connection = True

    def log_message(self, *args):
        pass


server = HTTPServer(("127.0.0.1", int(sys.argv[1])), Faulty)
print("ready", flush=True)
server.serve_forever()
"""


def test_the_node_refuses_what_a_faulty_remote_server_answers_and_serves_on(
    http_netns: LoopbackNamespace, demo_config: Path, tmp_path: Path
) -> None:
    """A remote server whose refusal breaks off mid-body: each ~/synthesize call is refused with the reason and
    the node serves the next, where the exception out of the check once ended the executor's spin and the node."""
    from ros_helpers import require_ros
    from ros_helpers.netns import serving

    require_ros()
    port = PORT + 1
    faulty = http_netns.popen([sys.executable, "-c", FAULTY_SERVER, str(port)], stdout=subprocess.PIPE)
    try:
        assert faulty.stdout is not None and faulty.stdout.readline().strip() == "ready"
        values = {"model.backend": "remote", "model.remote_url": f"http://127.0.0.1:{port}/v1"}
        params = node_params_file(demo_config, tmp_path / "faulty.yaml", **values)
        with serving(http_netns, ["--params-file", str(params)], name="faulty-remote-node") as node:
            answers = http_netns.client("synthesize", requests=[{"text": "Hello."}, {"text": "Hello again."}])
            alive = node.process.poll() is None
            log = node.output()
    finally:
        faulty.kill()
        faulty.wait()
    assert alive, log[-3000:]
    for answer in answers["responses"]:
        assert not answer["success"]
        assert answer["message"].startswith("the remote server refused the request (400), and its reason broke off: ")
    assert "Traceback" not in log


# -- every format, the clients people run, SSE, lists, uploaded voices ------------------------------------------

MEDIUM_TEXT = "The robot speaks in every format. " * 4


def decoded_audio(path: Path) -> tuple[int, int, int]:
    """FFmpeg's (PyAV's) decode of a body: samples per channel, rate, channels."""
    av = pytest.importorskip("av")
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return samples, stream.codec_context.sample_rate, stream.codec_context.channels


@pytest.mark.parametrize("response_format", ["mp3", "opus", "aac", "flac", "wav", "pcm", None])
def test_the_openai_client_streams_every_format_and_none_is_mp3(
    server: Server, http_netns: LoopbackNamespace, tmp_path: Path, response_format: str | None
) -> None:
    """Read as it streams, each body decodes to the length of the same speech in pcm; no format named is mp3 (that
    the first bytes leave before the speech ends is the test of a client that goes away, in every format)."""
    fields: dict[str, Any] = {} if response_format is None else {"response_format": response_format}
    out = tmp_path / f"speech.{response_format}"
    answer = speech(http_netns, out, streamed=True, input=MEDIUM_TEXT, extra={"seed": 11}, **fields)
    assert answer["status"] == 200, answer
    media = {"mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac", "wav": "audio/wav"}
    assert answer["headers"]["content-type"] == media.get(response_format or "mp3", "audio/pcm")
    rate, channels = int(answer["headers"]["x-sample-rate"]), int(answer["headers"]["x-channels"])
    if response_format == "pcm":
        seconds = out.stat().st_size / 2 / channels / rate
    else:
        samples, decoded_rate, decoded_channels = decoded_audio(out)
        assert decoded_channels == channels
        seconds = samples / decoded_rate
    reference = speech(http_netns, tmp_path / "ref.pcm", input=MEDIUM_TEXT, response_format="pcm", extra={"seed": 11})
    assert reference["status"] == 200
    assert seconds == pytest.approx((tmp_path / "ref.pcm").stat().st_size / 2 / channels / rate, abs=0.15)


def test_sse_as_openai_defines_it_through_httpx(server: Server, http_netns: LoopbackNamespace, tmp_path: Path) -> None:
    body = {"model": MODEL, "input": MEDIUM_TEXT, "stream_format": "sse", "response_format": "pcm", "seed": 12}
    answer = call(http_netns, "sse", base_url=BASE_URL, body=body, out=str(tmp_path / "sse.pcm"))
    assert answer["status"] == 200 and answer["headers"]["content-type"].startswith("text/event-stream"), answer
    assert answer["deltas"] > 1
    (done,) = answer["events"]
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    plain = speech(http_netns, tmp_path / "plain.pcm", input=MEDIUM_TEXT, response_format="pcm", extra={"seed": 12})
    assert plain["status"] == 200
    assert_same_audio(pcm_samples(tmp_path / "sse.pcm"), pcm_samples(tmp_path / "plain.pcm"))


def test_home_assistants_request_gets_mp3_at_its_speed(
    server: Server, http_netns: LoopbackNamespace, tmp_path: Path
) -> None:
    """sfortis/openai_tts's body and headers (openaitts_engine.py: get_tts), its speed 1.5: an mp3 two thirds as
    long as the same request at 1.0."""
    lengths = {}
    for speed in (1.0, 1.5):
        body = {"model": MODEL, "input": MEDIUM_TEXT, "voice": "guide", "response_format": "mp3", "speed": speed}
        out = tmp_path / f"ha-{speed}.mp3"
        headers = {"Content-Type": "application/json", "User-Agent": "HomeAssistant-OpenAI-TTS"}
        answer = call(http_netns, "raw", body=json.dumps({**body, "seed": 13}), headers=headers, out=str(out))
        assert answer["status"] == 200 and answer["headers"]["content-type"] == "audio/mpeg", answer
        samples, rate, _ = decoded_audio(out)
        lengths[speed] = samples / rate
    assert lengths[1.5] == pytest.approx(lengths[1.0] / 1.5, abs=0.1)  # give or take an MP3 frame and its delay


def test_open_webuis_requests_get_its_lists_and_an_mp3(
    server: Server, http_netns: LoopbackNamespace, tmp_path: Path
) -> None:
    """Open WebUI (backend/open_webui/routers/audio.py): its voice and model menus from GET {base}/audio/voices and
    /audio/models without a key, then its body (input, voice, and the model it sets) with an empty key."""
    voices = call(http_netns, "raw", method="GET", path="/v1/audio/voices")
    assert {voice["id"]: voice["name"] for voice in voices["json"]["voices"]} == {"butler": "butler", "guide": "guide"}
    models = call(http_netns, "raw", method="GET", path="/v1/audio/models")
    assert [model["id"] for model in models["json"]["models"]] == [MODEL]
    card = call(http_netns, "raw", method="GET", path=f"/v1/models/{MODEL}")
    assert card["json"]["id"] == MODEL
    body = json.dumps({"input": TEXT, "voice": "butler", "model": MODEL})
    headers = {"Content-Type": "application/json", "Authorization": "Bearer "}
    answer = call(http_netns, "raw", body=body, headers=headers, out=str(tmp_path / "owui.mp3"))
    assert answer["status"] == 200 and answer["headers"]["content-type"] == "audio/mpeg", answer
    assert decoded_audio(tmp_path / "owui.mp3")[0] > 0


@pytest.fixture(scope="module")
def upload_server(
    http_netns: LoopbackNamespace,
    demo_config: Path,
    codec_tiny_streaming_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Server, Path]]:
    """A server with a key that takes uploads into a voice directory of its own, and lists without the key."""
    folder = tmp_path_factory.mktemp("uploads")
    uploads = folder / "uploaded"
    uploads.mkdir()
    values = {
        "llama.n_threads": 1,
        "model.codec_dir": str(codec_tiny_streaming_dir),
        "voices.directories": [str(uploads)],
    }
    config = node_params_file(demo_config, folder / "server.yaml", **values)
    key = folder / "key"
    key.write_text("s3cret\n")
    args = ("--port", "8003", "--api-key-file", str(key), "--voice-upload-dir", str(uploads), "--public-lists")
    running = Server(http_netns, config, *args, name="uploads")
    try:
        running.wait_ready()
        yield running, uploads
    finally:
        assert running.stop() == 0, running.output()[-3000:]


UPLOAD_URL = "http://127.0.0.1:8003/v1"


def test_an_uploaded_voice_is_listed_usable_at_once_and_deleted(
    upload_server: tuple[Server, Path], http_netns: LoopbackNamespace, tmp_path: Path
) -> None:
    server, uploads = upload_server
    clip = tmp_path / "visitor.wav"
    sf.write(clip, 0.3 * np.sin(np.arange(SAMPLE_RATE * 2) / 10.0), SAMPLE_RATE)
    fields = {"name": "visitor", "consent": "recorded", "ref_text": "Hello, I am a visitor."}
    args: dict[str, Any] = {"base_url": UPLOAD_URL, "clip": str(clip), "fields": fields}
    refused = call(http_netns, "upload", **args)
    assert refused["status"] == 401
    added = call(http_netns, "upload", api_key="s3cret", model=MODEL, out=str(tmp_path / "o"), **args)
    assert added["status"] == 201, added
    assert added["json"]["voice"]["id"] == "visitor" and added["json"]["voice"]["has_transcript"]
    assert sorted(p.name for p in uploads.iterdir()) == ["visitor.txt", "visitor.wav"]
    listed = call(http_netns, "raw", port=8003, method="GET", path="/v1/audio/voices")  # without the key: public
    assert [voice["id"] for voice in listed["json"]["voices"]] == ["visitor"]
    spoken = call(
        http_netns,
        "openai",
        base_url=UPLOAD_URL,
        api_key="s3cret",
        model=MODEL,
        input=TEXT,
        voice="visitor",
        out=str(tmp_path / "v.mp3"),
    )
    assert spoken["status"] == 200, spoken
    again = call(http_netns, "upload", api_key="s3cret", **args)
    assert again["status"] == 400 and "exists already" in again["json"]["error"]["message"]
    deleted = call(http_netns, "upload", base_url=UPLOAD_URL, api_key="s3cret", delete="visitor")
    assert deleted["status"] == 200 and list(uploads.iterdir()) == []
    gone = call(
        http_netns,
        "openai",
        base_url=UPLOAD_URL,
        api_key="s3cret",
        model=MODEL,
        input=TEXT,
        voice="visitor",
        out=str(tmp_path / "g.mp3"),
    )
    assert gone["status"] == 400
    assert "Traceback" not in server.output()


HOSTILE_UPLOADS = [
    ({"clip_text": "x", "repeat": 11 * 1024 * 1024, "fields": {"name": "huge"}}, 413, "longer than the"),
    ({"clip_text": "not audio at all", "fields": {"name": "text"}}, 400, "not audio this server reads"),
    ({"seconds": 31, "fields": {"name": "long"}}, 400, "longer than the 30 s of limits.max_reference_seconds"),
    ({"fields": {"name": "../escape"}}, 400, "cannot be a voice's name"),
    ({"fields": {"name": "a/b"}}, 400, "cannot be a voice's name"),
    ({"fields": {"name": ".hidden"}}, 400, "cannot be a voice's name"),
    ({"fields": {"name": "x" * 65}}, 400, "cannot be a voice's name"),
    ({"fields": {"name": "ok", "path": "/etc/passwd"}}, 400, "unknown field 'path'"),
    ({"fields": {}}, 400, "give the clip in 'audio_sample'"),
    ({"delete": "..%2F..%2Fetc%2Fpasswd"}, 404, "Not Found"),  # a "/" decoded is no voice's path
    ({"delete": "..%2Eescape"}, 400, "is not an uploaded voice"),
    ({"delete": "nobody"}, 400, "is not an uploaded voice"),
]


@pytest.mark.parametrize(("upload_args", "status", "reason"), HOSTILE_UPLOADS)
def test_a_hostile_upload_is_refused_and_writes_nothing(
    upload_server: tuple[Server, Path],
    http_netns: LoopbackNamespace,
    tmp_path: Path,
    upload_args: dict[str, Any],
    status: int,
    reason: str,
) -> None:
    _, uploads = upload_server
    request = dict(upload_args)
    clip = tmp_path / "clip.wav"
    sf.write(clip, 0.3 * np.sin(np.arange(SAMPLE_RATE * request.pop("seconds", 1)) / 10.0), SAMPLE_RATE)
    source = {} if "clip_text" in request else {"clip": str(clip)}
    answer = call(http_netns, "upload", base_url=UPLOAD_URL, api_key="s3cret", **source, **request)
    assert answer["status"] == status, answer
    assert reason in answer["json"]["error"]["message"]
    assert list(uploads.iterdir()) == []


def test_an_upload_while_speech_streams_leaves_both_whole(
    upload_server: tuple[Server, Path], http_netns: LoopbackNamespace, tmp_path: Path
) -> None:
    _, uploads = upload_server
    clip = tmp_path / "busy.wav"
    sf.write(clip, 0.3 * np.sin(np.arange(SAMPLE_RATE * 2) / 7.0), SAMPLE_RATE)
    answer = call(
        http_netns,
        "upload",
        base_url=UPLOAD_URL,
        api_key="s3cret",
        clip=str(clip),
        fields={"name": "busy"},
        model=MODEL,
        during=MEDIUM_TEXT,
        response_format="pcm",
        out=str(tmp_path / "during.pcm"),
    )
    assert answer["status"] == 201, answer
    assert answer["during"]["status"] == 200 and (tmp_path / "during.pcm").stat().st_size > 0
    deleted = call(http_netns, "upload", base_url=UPLOAD_URL, api_key="s3cret", delete="busy")
    assert deleted["status"] == 200 and list(uploads.iterdir()) == []


def test_uploads_need_the_owners_leave(server: Server, http_netns: LoopbackNamespace, tmp_path: Path) -> None:
    """The module's server names no upload directory and has no key: an upload is refused, nothing written."""
    clip = tmp_path / "clip.wav"
    sf.write(clip, np.zeros(SAMPLE_RATE), SAMPLE_RATE)
    answer = call(http_netns, "upload", base_url=BASE_URL, clip=str(clip), fields={"name": "intruder"})
    assert answer["status"] == 403 and "--voice-upload-dir and an API key" in answer["json"]["error"]["message"]


# -- MOSS-TTS-Nano: 48 kHz stereo, as it is or converted ------------------------------------------------------

NANO_PORT, NANO_MONO_PORT = PORT + 1, PORT + 2
NANO_MODEL = "MOSS-TTS-Nano"
NANO_RATE, NANO_CHANNELS = 48000, 2


@pytest.fixture(scope="module")
def nano_servers(
    http_netns: LoopbackNamespace, nano_demo_config: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Server]]:
    """Two servers of the Nano demo: one giving out its own 48 kHz stereo, one set to 16 kHz mono."""
    folder = tmp_path_factory.mktemp("http-nano")
    own = node_params_file(nano_demo_config, folder / "nano.yaml", **{"llama.n_threads": 1})
    mono = {"llama.n_threads": 1, "audio.output_sample_rate": 16000, "audio.output_channels": "mono"}
    converted = node_params_file(nano_demo_config, folder / "nano-mono.yaml", **mono)
    servers = {
        "stereo": Server(http_netns, own, "--port", str(NANO_PORT), name="nano"),
        "mono": Server(http_netns, converted, "--port", str(NANO_MONO_PORT), name="nano-mono"),
    }
    try:
        for running in servers.values():
            running.wait_ready()
        yield servers
    finally:
        codes = {name: running.stop() for name, running in servers.items()}
        assert codes == {"stereo": 0, "mono": 0}, {name: s.output()[-3000:] for name, s in servers.items()}


def nano_speech(netns: LoopbackNamespace, port: int, out: Path, **fields: Any) -> dict[str, Any]:
    extra = fields.pop("extra", {})
    base_url = f"http://127.0.0.1:{port}/v1"
    return call(netns, "openai", base_url=base_url, model=NANO_MODEL, out=str(out), extra_body=extra, **fields)


def test_the_openai_client_gets_nano_speech_in_48_khz_stereo(
    nano_servers: dict[str, Server], http_netns: LoopbackNamespace, tmp_path: Path
) -> None:
    """WAV, FLAC and raw PCM say and hold 48 kHz stereo, interleaved; streamed PCM is the whole decode's."""
    fields: dict[str, Any] = {"input": TEXT, "extra": {"seed": 2}}
    wav = nano_speech(http_netns, NANO_PORT, tmp_path / "nano.wav", response_format="wav", **fields)
    assert wav["status"] == 200, wav
    audio, rate = sf.read(tmp_path / "nano.wav", dtype="int16")
    assert rate == NANO_RATE and audio.ndim == 2 and audio.shape[1] == NANO_CHANNELS and np.abs(audio).max() > 0
    streamed = nano_speech(http_netns, NANO_PORT, tmp_path / "nano.pcm", streamed=True, response_format="pcm", **fields)
    assert streamed["status"] == 200, streamed
    headers = {key.lower(): value for key, value in streamed["headers"].items()}
    assert (headers["x-sample-rate"], headers["x-channels"]) == (str(NANO_RATE), str(NANO_CHANNELS))
    whole = {"input": TEXT, "extra": {"seed": 2, "stream": False}}
    flac = nano_speech(http_netns, NANO_PORT, tmp_path / "nano.flac", response_format="flac", **whole)
    assert flac["status"] == 200, flac
    interleaved = pcm_samples(tmp_path / "nano.pcm")
    assert_same_audio(interleaved, audio.reshape(-1))  # the streamed PCM: the WAV's frames, channel by channel
    flac_audio, flac_rate = sf.read(tmp_path / "nano.flac", dtype="int16")
    assert flac_rate == NANO_RATE and flac_audio.shape == audio.shape
    assert_same_audio(flac_audio.reshape(-1), interleaved)  # the whole decode is the stream's


def test_a_nano_server_set_to_16_khz_mono_gives_that_out(
    nano_servers: dict[str, Server], http_netns: LoopbackNamespace, tmp_path: Path
) -> None:
    """audio.output_* convert what serve gives out: 16 kHz mono, the stereo one's mean of channels resampled."""
    fields: dict[str, Any] = {"input": TEXT, "response_format": "wav", "extra": {"seed": 2}}
    assert nano_speech(http_netns, NANO_PORT, tmp_path / "stereo.wav", **fields)["status"] == 200
    assert nano_speech(http_netns, NANO_MONO_PORT, tmp_path / "mono.wav", **fields)["status"] == 200
    stereo, _ = sf.read(tmp_path / "stereo.wav", dtype="float32")
    mono, rate = sf.read(tmp_path / "mono.wav", dtype="float32")
    assert rate == 16000 and mono.ndim == 1
    expected = soxr.resample(stereo.mean(axis=1), NANO_RATE, 16000)
    assert mono.shape == expected.shape
    # Both WAVs are 16-bit: the stereo one's rounding, carried through the conversion, and the mono one's own.
    assert np.abs(mono - expected).max() <= 3 / 32767


def test_the_remote_backend_refuses_a_nano_servers_audio_naming_the_fix(
    nano_servers: dict[str, Server],
    http_netns: LoopbackNamespace,
    demo_config: Path,
    tmp_path: Path,
) -> None:
    """The remote backend reads 24 kHz mono: a server that says it sends another format (48 kHz stereo, or 16 kHz
    mono) is refused before any sample is read as the wrong one, with the server's keys that would fit it."""
    for port, said in ((NANO_PORT, "48000 Hz in 2 channel(s)"), (NANO_MONO_PORT, "16000 Hz in 1 channel(s)")):
        values = {"model.backend": "remote", "model.remote_url": f"http://127.0.0.1:{port}/v1"}
        config = node_params_file(demo_config, tmp_path / f"remote-{port}.yaml", **values)
        answer = call(http_netns, "remote_error", config=str(config), input=TEXT)
        kind, message = answer["error"]
        assert kind == "RemoteError" and said in message, answer
        assert "audio.output_sample_rate 24000 and audio.output_channels mono" in message
