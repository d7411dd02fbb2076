"""HTTP clients of the speech server for the tests, run in the server's loopback-only namespace:
``client.py COMMAND ARGUMENTS_FILE`` (a JSON object); prints one JSON line with what it saw.

- ``openai``     the official ``openai`` package: ``client.audio.speech.create`` (``streamed`` false) or
                 ``with_streaming_response`` (true, read in small pieces as they arrive); the body to ``out``
- ``raw``        one request through ``http.client`` (a body as text, or ``repeat`` bytes of one character)
- ``concurrent`` ``count`` openai requests at once, each to ``out`` with its index; their statuses
- ``disconnect`` a streamed request dropped after its first audio; then a request that must be answered
- ``busy``       a request while a long one speaks, then one after the long one is dropped
- ``remote``     the Python API speaking through the server (``model.backend: remote``)
- ``sse``        OpenAI's stream_format "sse" read through httpx2 (the openai client's HTTP library) as events arrive:
                 the audio of the speech.audio.delta events to ``out``, the other events
- ``upload``     vLLM-Omni's voice upload through httpx2 (multipart: ``audio_sample``, ``name``, ``consent``, ...), or a
                 delete (``delete``); ``during`` names a text spoken (streamed) while the upload is made
"""

from __future__ import annotations

import base64
import http.client
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx  # the HTTP library of the openai client (3.x), the fork of httpx it ships with
import openai


def _client(args: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=args["base_url"], api_key=args.get("api_key", "none"), max_retries=0, timeout=300)


def speech(args: dict[str, Any]) -> dict[str, Any]:
    """One request with the openai client; the body to ``out``, and when each piece arrived."""
    client = _client(args)
    fields = {"model": args["model"], "input": args["input"], "voice": args.get("voice", "default")}
    for name in ("response_format", "speed", "instructions"):
        if name in args:
            fields[name] = args[name]
    extra = args.get("extra_body") or None
    started = time.monotonic()
    try:
        if args.get("streamed"):
            pieces = []
            with client.audio.speech.with_streaming_response.create(**fields, extra_body=extra) as response:
                status, headers = response.status_code, dict(response.headers)
                first_s = None
                for piece in response.iter_bytes(chunk_size=512):
                    first_s = first_s if first_s is not None else time.monotonic() - started
                    pieces.append(piece)
            body = b"".join(pieces)
        else:
            response = client.audio.speech.create(**fields, extra_body=extra)
            status, headers, body, first_s = 200, dict(response.response.headers), response.content, None
    except openai.APIStatusError as error:
        return {"status": error.status_code, "error": error.response.json()}
    Path(args["out"]).write_bytes(body)
    return {
        "status": status,
        "bytes": len(body),
        "headers": headers,
        "first_s": first_s,
        "total_s": time.monotonic() - started,
    }


def raw(args: dict[str, Any]) -> dict[str, Any]:
    connection = http.client.HTTPConnection(args.get("host", "127.0.0.1"), args.get("port", 8000), timeout=300)
    if "repeat" in args:
        body: bytes | None = args["repeat_char"].encode() * args["repeat"]
    else:
        body = args["body"].encode() if "body" in args else None
    connection.request(args.get("method", "POST"), args.get("path", "/v1/audio/speech"), body, args.get("headers", {}))
    response = connection.getresponse()
    data = response.read()
    answer: dict[str, Any] = {"status": response.status, "headers": dict(response.getheaders())}
    try:
        answer["json"] = json.loads(data)
    except ValueError:
        answer["bytes"] = len(data)
        if "out" in args:
            Path(args["out"]).write_bytes(data)
    return answer


def concurrent(args: dict[str, Any]) -> dict[str, Any]:
    def one(index: int) -> dict[str, Any]:
        return speech({**args, "out": f"{args['out']}.{index}", "input": args["inputs"][index]})

    with ThreadPoolExecutor(len(args["inputs"])) as pool:
        return {"answers": list(pool.map(one, range(len(args["inputs"]))))}


def disconnect(args: dict[str, Any]) -> dict[str, Any]:
    """Drop a streamed response (in ``response_format``, pcm unless named) after its first piece; the server must
    cancel it and answer the next request."""
    connection = http.client.HTTPConnection("127.0.0.1", args.get("port", 8000), timeout=300)
    response_format = args.get("response_format", "pcm")
    body = json.dumps({"model": args["model"], "input": args["long_input"], "response_format": response_format})
    connection.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    first = response.read(64)
    connection.close()
    started = time.monotonic()
    after = speech({key: value for key, value in args.items() if key != "response_format"} | {"streamed": False})
    return {
        "first_status": response.status,
        "first_bytes": len(first),
        "after": after,
        "after_s": time.monotonic() - started,
    }


def busy(args: dict[str, Any]) -> dict[str, Any]:
    """While a long streamed request speaks, another; then, once the first is dropped, one more (retried while
    the server has still to see that the first went away)."""
    connection = http.client.HTTPConnection("127.0.0.1", args["port"], timeout=300)
    body = json.dumps({"model": args["model"], "input": args["long_input"], "response_format": "pcm"})
    connection.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    response.read(64)
    refused = speech({**args, "streamed": False})
    connection.close()
    for _ in range(300):
        after = speech({**args, "streamed": False})
        if after["status"] != 429:
            break
        time.sleep(0.1)
    return {"refused": refused, "after": after}


def remote(args: dict[str, Any]) -> dict[str, Any]:
    """The Python API on ``model.backend: remote``: its voices, a stream (chunks and samples to ``out``), the
    refusals of a voice the server lacks and of streamed text, and a cancel after the first chunk."""
    import numpy as np

    from moss_tts_node import RequestError, open_synthesizer
    from moss_tts_node.pcm import float_to_pcm16

    answer: dict[str, Any] = {}
    with open_synthesizer(args["config"]) as synth:
        answer["name"] = synth.name
        answer["voices"] = {v.name: [v.seconds, v.transcript] for v in synth.voices}
        stream = synth.stream(args["input"], seed=args["seed"], voice=synth.voices["guide"])
        chunks = list(stream)
        answer["finals"] = [chunk.is_final for chunk in chunks]
        answer["report"] = {"stop": str(stream.report.stop_reason), "audio_s": stream.report.audio_seconds}
        Path(args["out"]).write_bytes(float_to_pcm16(np.concatenate([chunk.samples for chunk in chunks])))
        refusals = []
        for attempt in (lambda: synth.stream("Hi.", voice="nobody"), lambda: synth.stream_text(["Hi."])):
            try:
                attempt()
                refusals.append(None)
            except RequestError as error:
                refusals.append(str(error))
        answer["refusals"] = refusals
        cancel = [False]
        stream = synth.stream(args["long_input"], cancel=lambda: cancel[0])
        for _chunk in stream:
            cancel[0] = True
        answer["cancelled"] = str(stream.report.stop_reason)
    return answer


def remote_error(args: dict[str, Any]) -> dict[str, Any]:
    """What a stream on ``model.backend: remote`` raises (its class and message), or None."""
    from moss_tts_node import open_synthesizer

    with open_synthesizer(args["config"]) as synth:
        try:
            list(synth.stream(args["input"], seed=1))
        except Exception as error:  # the test names the one it expects
            return {"error": [type(error).__name__, str(error)]}
    return {"error": None}


def sse(args: dict[str, Any]) -> dict[str, Any]:
    started = time.monotonic()
    audio, events, first_s = [], [], None
    with httpx.stream("POST", f"{args['base_url']}/audio/speech", json=args["body"], timeout=300) as response:
        if response.status_code != 200:
            response.read()
            return {"status": response.status_code, "error": response.json()}
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[len("data: ") :])
            if event["type"] == "speech.audio.delta":
                first_s = first_s if first_s is not None else time.monotonic() - started
                audio.append(base64.b64decode(event["audio"]))
            else:
                events.append(event)
        headers = dict(response.headers)
    Path(args["out"]).write_bytes(b"".join(audio))
    total_s = time.monotonic() - started
    return {
        "status": 200,
        "headers": headers,
        "deltas": len(audio),
        "events": events,
        "first_s": first_s,
        "total_s": total_s,
    }


def upload(args: dict[str, Any]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args['api_key']}"} if "api_key" in args else {}
    url = f"{args['base_url']}/audio/voices"
    spoken = None
    with ThreadPoolExecutor(1) as pool:
        if "during" in args:
            spoken = pool.submit(speech, {**args, "input": args["during"], "streamed": True, "out": args["out"]})
            time.sleep(args.get("delay_s", 0.5))
        if "delete" in args:
            response = httpx.delete(f"{url}/{args['delete']}", headers=headers, timeout=300)
        else:
            clip = (
                Path(args["clip"]).read_bytes()
                if "clip" in args
                else args["clip_text"].encode() * args.get("repeat", 1)
            )
            files = {"audio_sample": (args.get("filename", "clip.wav"), clip, "audio/wav")}
            response = httpx.post(url, headers=headers, files=files, data=args.get("fields", {}), timeout=300)
        answer = {"status": response.status_code, "json": response.json()}
        if spoken is not None:
            answer["during"] = spoken.result()
    return answer


COMMANDS = {
    "openai": speech,
    "raw": raw,
    "concurrent": concurrent,
    "disconnect": disconnect,
    "busy": busy,
    "remote": remote,
    "remote_error": remote_error,
    "sse": sse,
    "upload": upload,
}

if __name__ == "__main__":
    command, arguments = sys.argv[1], json.loads(Path(sys.argv[2]).read_text())
    print(json.dumps(COMMANDS[command](arguments)), flush=True)
