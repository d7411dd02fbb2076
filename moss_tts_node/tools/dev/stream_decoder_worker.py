"""One side of ``stream_decoder_bench``'s comparison: a process that runs stream decoder graphs on request.

Run as ``python -m moss_tts_node.tools.dev.stream_decoder_worker``, with ``moss_tts_node`` being the tree
whose runtime runs the graphs: the bench starts one worker on this tree and one on an earlier revision's,
into which it copies this file, ``resources.py`` and ``codec/quantizer.py`` (they use nothing else of the package
but ``StreamDecoder``, whose constructor, ``decode`` and ``reset`` every revision has, and the errors). Requests
arrive as JSON lines on stdin, each answered by one JSON line on stdout:

- ``{"load": GRAPH, "threads": N, "session_config": {KEY: VALUE}}``: a ``StreamDecoder`` of GRAPH with N
  intra-op threads (the one before is dropped first, so one graph is in memory at a time), its ONNX Runtime
  session given the config entries on top of the runtime's own (a setting tried on any revision's
  runtime without changing it); answers its state bytes.
- ``{"time": CHUNK, "frames": F}``: F random frames (seed 0) streamed in calls of CHUNK frames; answers the
  median seconds of a call, and its median CPU seconds, which another process's load changes less (the
  first call is not timed: it allocates).
- ``{"decode": CHUNK, "frames": F, "out": PATH}``: the same stream's audio, saved to PATH (.npy).

Every answer carries the process's peak RSS so far.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np

from moss_tts_node.codec.quantizer import CODEBOOK_SIZE, CODEC_QUANTIZERS
from moss_tts_node.codec.stream_decoder import StreamDecoder
from moss_tts_node.tools.dev.resources import peak_rss_mib


def _codes(frames: int) -> np.ndarray:
    """Random codes of all the codec's levels: what every revision's graph takes."""
    return np.random.default_rng(0).integers(0, CODEBOOK_SIZE, (frames, CODEC_QUANTIZERS))


def _calls(decoder: StreamDecoder, chunk: int, frames: int) -> tuple[list[tuple[float, float]], np.ndarray]:
    """Stream ``frames`` frames from a reset decoder in calls of ``chunk``: each call's seconds of wall time and
    of CPU time (all the process's threads), and the audio."""
    codes = _codes(frames)
    decoder.reset()
    seconds, audio = [], []
    for start in range(0, frames, chunk):
        began, cpu = time.perf_counter(), time.process_time()
        audio.append(decoder.decode(codes[start : start + chunk]))
        seconds.append((time.perf_counter() - began, time.process_time() - cpu))
    return seconds, np.concatenate(audio)


def _sessions_taking(entries: dict[str, str]) -> None:
    """Make the sessions this process opens from now on take ``entries`` after the runtime's own settings."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)  # a setting the runtime also makes is overwritten, with a warning per session
    opened = getattr(ort.InferenceSession, "runtime_class", ort.InferenceSession)

    class Session(opened):  # type: ignore[misc, valid-type]
        runtime_class = opened

        def __init__(self, model: Any, sess_options: Any = None, *args: Any, **kwargs: Any) -> None:
            sess_options = sess_options or ort.SessionOptions()
            for key, value in entries.items():
                sess_options.add_session_config_entry(key, value)
            super().__init__(model, sess_options, *args, **kwargs)

    ort.InferenceSession = Session


def answer(request: dict[str, Any], state: dict[str, StreamDecoder]) -> dict[str, Any]:
    if "load" in request:
        state.pop("decoder", None)  # its graph is freed before the next one loads
        _sessions_taking(request.get("session_config", {}))
        state["decoder"] = StreamDecoder(request["load"], threads=request["threads"])
        return {"state_bytes": state["decoder"].state_bytes}
    if "time" in request:
        seconds, _ = _calls(state["decoder"], request["time"], request["frames"])
        wall, cpu = np.median(seconds[1:], axis=0)
        return {"seconds_per_call": float(wall), "cpu_seconds_per_call": float(cpu)}
    _, audio = _calls(state["decoder"], request["decode"], request["frames"])
    np.save(request["out"], audio)
    return {}


def main() -> None:
    state: dict[str, StreamDecoder] = {}
    for line in sys.stdin:
        reply = answer(json.loads(line), state)
        print(json.dumps({**reply, "peak_rss_mib": peak_rss_mib()}), flush=True)


if __name__ == "__main__":
    main()
