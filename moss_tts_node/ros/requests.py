"""The node's requests from their arrival to their answer: checked, put in line, spoken, answered
(docs/design.md, "Threads").

A callback of the node hands its message here and returns, so nothing holds the executor (docs/security.md,
"Nothing holds the executor").
The check runs on the intake's thread (serving/intake.py), one request at a time in the order they arrived, which is
the order of the line: a request is refused unless the node serves (ros/lifecycle.py); its voices are looked up
among the loaded model's (ros/voices.py); ``stream()`` (or ``stream_text()``) checks it (fields, language, text,
room in the context) without generating, so a bad request never takes a turn nor interrupts the one being
spoken. It runs with the parameters in force when it was checked (one ``Settings`` object). Then it waits in
the line of this activation (serving/queue.py), whose worker iterates its stream and publishes each chunk, or keeps
it for a whole-utterance answer.

Whatever refuses a request raises ``Refused`` with the reason for its sender; it is counted and logged here,
once. Kept here too: the counts of requests spoken and refused, the last one's figures, and the callbacks still
waiting to answer, which a transition that ends the line waits for. No node: ``test/test_ros_requests.py`` drives
it without a middleware.
"""

from __future__ import annotations

import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

import numpy as np
from moss_tts_msgs.action import Speak
from moss_tts_msgs.msg import AudioChunk as AudioChunkMsg
from moss_tts_msgs.msg import TextChunk
from moss_tts_msgs.srv import Synthesize

from moss_tts_node.audio_output import AudioFormat
from moss_tts_node.errors import ExpectedTooLong, MossTTSError, RequestError
from moss_tts_node.ros.audio import encode
from moss_tts_node.ros.lifecycle import DEACTIVATING, SHUTTING_DOWN, Loan, Phase, check_serving
from moss_tts_node.ros.messages import RequestCounts, speech_request, timing_message
from moss_tts_node.ros.parameters import Settings
from moss_tts_node.ros.text_stream import NewStream
from moss_tts_node.ros.voices import requested_voices
from moss_tts_node.serving.intake import CHECKS_WAITING, Intake
from moss_tts_node.serving.queue import INTERRUPTED, Outcome, Refused, RequestQueue, State, Ticket
from moss_tts_node.synthesis.request import SpeechRequest, check_request
from moss_tts_node.synthesis.results import AudioChunk, AudioStream
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.timing import TimingReport

# The interfaces requests come from, as the log lines name them.
TEXT = "~/text"
TEXT_STREAM = "~/text_stream"
SYNTHESIZE = "~/synthesize"
SPEAK = "~/speak"
# How long a transition that ends the requests in line waits for the last of them to be answered.
ANSWERS_WAIT_S = 5.0
# The reasons a request is stopped with, besides the line's and the lifecycle's.
CLIENT_CANCEL = "canceled by the client"
STOPPED = "stopped by ~/stop"
EMPTIED = "dropped from the queue by ~/stop (stop_empties_queue true)"
# How an utterance ended, by the reason its request was cancelled with: its final chunk's end_reason. Any other
# reason is an error's (a transition that failed).
END_REASONS = {
    CLIENT_CANCEL: AudioChunkMsg.END_REASON_CANCEL,
    STOPPED: AudioChunkMsg.END_REASON_STOP,
    INTERRUPTED: AudioChunkMsg.END_REASON_INTERRUPT,
    DEACTIVATING: AudioChunkMsg.END_REASON_DEACTIVATION,
    SHUTTING_DOWN: AudioChunkMsg.END_REASON_SHUTDOWN,
}


class Log(Protocol):
    """Where the requests' lines go: the node's logger."""

    def info(self, message: str) -> Any: ...
    def warning(self, message: str) -> Any: ...
    def error(self, message: str) -> Any: ...


# (request id, chunk, encoding, end reason: the final chunk's, else ""): ros/audio.py's AudioOut.publish
Publish = Callable[[str, AudioChunk, str, str], None]
# What a message asks for, as the synthesizer takes it, its voice looked up among the loaded model's.
Asked = Callable[[Synthesizer], SpeechRequest]


@dataclass
class Job:
    """One request as the node runs it: a checked stream, where its audio goes, its progress."""

    stream: AudioStream
    request_id: str
    interface: str  # where it came from (TEXT, TEXT_STREAM, SPEAK, SYNTHESIZE)
    encoding: str
    audio: AudioFormat  # the rate and channels of its samples
    collected: list[np.ndarray] | None  # a whole-utterance answer keeps the samples; None publishes them
    received: float = field(default_factory=time.monotonic)
    started: float | None = None
    chunks: int = 0
    audio_s: float = 0.0

    @property
    def queue_wait_s(self) -> float | None:
        """Seconds from its arrival to the start of its generation; None while it has not started."""
        return None if self.started is None else self.started - self.received


# How a checked request becomes a stream, and whether its samples are kept (a list) or published (None).
Start = Callable[[Synthesizer, SpeechRequest, Settings, threading.Event], tuple[AudioStream, list[np.ndarray] | None]]


class Requests:
    """Every request of the node: ``text``, ``text_stream``, ``speak`` and ``synthesize`` take them in, the line of
    each activation speaks them (``open``, ``end``), and the diagnostics read ``counts``.

    ``phase`` gives the node's lifecycle state at the moment of a check, ``node`` its full name (for the ways out
    of a refusal), ``model`` the loaded model, lent to each check; ``settings`` is set by the node on configure and
    on every parameter change.
    """

    def __init__(
        self, model: Loan[Synthesizer], phase: Callable[[], Phase], node: str, publish: Publish, log: Log
    ) -> None:
        self.settings: Settings | None = None  # the parameters in force, checked, from the first configure on
        self._model = model
        self._phase = phase
        self._node = node
        self._publish = publish
        self._log = log
        self._intake = Intake(CHECKS_WAITING)  # every request's check, in the order they arrive
        self._line: RequestQueue[Job] | None = None  # one per activation
        self._counts = threading.Lock()  # callbacks on several executor threads refuse requests at once
        self._completed = 0  # requests spoken to their end
        self._refused = 0  # bad requests, those a full line turned away, and those the node's state refused
        self._last: TimingReport | None = None  # the last request's figures
        self._answering = 0  # callbacks waiting for an outcome to answer with
        self._answered = threading.Condition()
        self._arrivals = 0  # requests handed to the intake so far: each one's number is its place in that order
        self._emptied_before = 0  # a request that arrived before this number was dropped by a stop, unchecked
        self._stopping = threading.Lock()  # a stop that empties the line, and the entries into it, one at a time

    # -- arrivals: each hands its request to the intake (a service call then waits for its answer) ------------

    def text(self, text: str) -> None:
        """A ``~/text`` message: spoken, its audio published. A refusal's log line and count are its only trace: a
        topic has no answer."""
        self._enter(TEXT, partial(self._admit, TEXT, lambda synth: SpeechRequest(text), uuid.uuid4().hex, _published))

    def text_stream(self, stream: NewStream, ended: Callable[[str], None]) -> None:
        """A new ``~/text_stream`` stream: its first chunk's request, spoken as its text arrives in its feed.
        ``ended(stream_id)`` is called once the request has ended, or at once when it is refused."""
        stream_id = stream.stream_id

        def on_update(ticket: Ticket[Job]) -> None:
            if ticket.state is State.DONE:
                ended(stream_id)

        def admit(arrival: int) -> Ticket[Job]:
            try:
                asked = partial(_stream_asked, stream.first, self._node)
                return self._admit(TEXT_STREAM, asked, stream_id, partial(_fed, stream), arrival, on_update)
            except BaseException:
                ended(stream_id)  # before its refusal is logged and counted: a chunk sent after that is dropped
                raise

        check = self._enter(TEXT_STREAM, admit, refused_as=f"text stream {stream_id!r} refused: ")
        if check.done() and check.exception() is not None:  # the intake refused it at once
            ended(stream_id)

    def speak(self, goal: Speak.Goal, goal_id: str, on_update: Callable[[Ticket[Job]], None]) -> Future[Ticket[Job]]:
        """A Speak goal, spoken and published: its check, then its place in line (ros/goals.py waits on it)."""
        asked = partial(_asked, goal, self._node)
        return self._enter(SPEAK, lambda arrival: self._admit(SPEAK, asked, goal_id, _published, arrival, on_update))

    def synthesize(
        self, request: Synthesize.Request, response: Synthesize.Response, audio: AudioFormat, encoding: str
    ) -> Synthesize.Response:
        """A ``~/synthesize`` call, answered once its request has ended: the whole utterance, at most
        ``max_response_seconds`` of it, in ``response``. A call refused before its turn is answered with the node's
        ``audio`` format and ``encoding`` now; a request that ran, with those it was checked under."""
        with self.answering():
            asked = partial(_asked, request, self._node)
            check = self._enter(SYNTHESIZE, partial(self._admit, SYNTHESIZE, asked, uuid.uuid4().hex, _whole))
            try:
                ticket = check.result()
            except Refused as refusal:
                return _answered(response, Outcome(False, str(refusal)), None, audio, encoding)
            outcome = ticket.wait()
            assert outcome is not None
            return _answered(response, outcome, ticket.job, ticket.job.audio, ticket.job.encoding)

    def refuse(self, interface: str, reason: object) -> Refused:
        """Count and log a request refused before its turn; the refusal, with ``reason``, for its answer."""
        with self._counts:
            self._refused += 1
        self._log.warning(f"{interface} request refused: {reason}")
        return Refused(str(reason))

    def cancel(self, ticket: Ticket[Job], reason: str) -> None:
        """Stop a request in line: a waiting one ends now, the one being spoken within one generation step."""
        line = self._line
        if line is not None:
            line.cancel(ticket, reason)

    def stop(self) -> str:
        """``~/stop``: stop the request being spoken (within one generation step) and, with
        ``stop_empties_queue``, every one behind it, those still being checked included; what it stopped, for
        the log and the service's answer. Never waits for a request to end. Only while active (the node says why
        there is nothing to stop in another state)."""
        line, settings = self._line, self.settings
        assert line is not None and settings is not None  # opened by the activation
        empty = settings.stop_empties_queue
        with self._stopping:
            if empty:
                with self._counts:
                    self._emptied_before = self._arrivals
            current, dropped = line.stop(STOPPED, EMPTIED if empty else None)
        said = "nothing to stop" if current is None else f"stopped {_named(current.job)}"
        if empty:
            said += f"; dropped the {len(dropped)} waiting" if dropped else "; none were waiting"
        elif line.depth:
            said += f"; the {line.depth} waiting go on (stop_empties_queue false)"
        self._log.info(f"~/stop: {said}")
        return said

    @contextmanager
    def answering(self) -> Iterator[None]:
        """Count a callback that answers once its request ends, so that ``end`` can wait for its answer."""
        with self._answered:
            self._answering += 1
        try:
            yield
        finally:
            with self._answered:
                self._answering -= 1
                self._answered.notify_all()

    # -- the line of an activation ------------------------------------------------------------------------

    def open(self, size: int) -> None:
        """A new line of requests, ``size`` waiting at most, for an activation."""
        assert self.settings is not None  # set by the configure before
        self._line = RequestQueue(self._speak, size, self.settings.queue_policy)

    def apply(self, settings: Settings) -> None:
        """New parameters for the requests checked from now on (those in line keep theirs), and the line's policy."""
        self.settings = settings
        if self._line is not None:
            self._line.policy = settings.queue_policy

    def end(self, reason: str) -> None:
        """End the request being spoken (within one step) and those waiting with ``reason``, refuse new ones, and
        wait until each has been answered (those still being checked are refused by the node's state). Nothing
        when no line was ever opened."""
        if self._line is None:
            return
        self._line.close(reason)
        with self._answered:
            self._answered.wait_for(lambda: self._answering == 0, timeout=ANSWERS_WAIT_S)

    def close(self, reason: str) -> None:
        """Refuse every request from now on with ``reason``, and answer those still being checked (the process
        ends)."""
        self._intake.close(reason)

    def counts(self, serving: bool) -> RequestCounts:
        """What the requests report on /diagnostics now; the line's depth and business only while ``serving``."""
        line = self._line if serving else None
        with self._counts:
            completed, refused = self._completed, self._refused
        return RequestCounts(
            queue_depth=0 if line is None else line.depth,
            busy=False if line is None else line.busy,
            completed=completed,
            refused=refused,
            last=self._last,
        )

    # -- the check, on the intake's thread, and the speech, on the line's worker ---------------------------

    def _enter(self, interface: str, admit: Callable[[int], Ticket[Job]], refused_as: str = "") -> Future[Ticket[Job]]:
        """Hand ``admit`` to the intake, with the request's number in the order of arrival: the future of the
        request's place in line, or of its refusal (counted and logged, ``refused_as`` before its reason), the
        intake's own included."""
        with self._counts:
            arrival = self._arrivals
            self._arrivals += 1
        try:
            return self._intake.submit(partial(self._checked, interface, partial(admit, arrival), refused_as))
        except Refused as refusal:
            refused: Future[Ticket[Job]] = Future()
            refused.set_exception(self.refuse(interface, f"{refused_as}{refusal}"))
            return refused

    def _checked(self, interface: str, admit: Callable[[], Ticket[Job]], refused_as: str) -> Ticket[Job]:
        """Run a request's check. Whatever it raises refuses the request with the reason, so that what waits for
        the verdict (a service callback, a goal's execute) gets a refusal to answer with and never an exception
        that would end the executor's spin. A failure of the check itself (a fault of the node's, on any
        backend) is refused too, saying so, and its traceback logged."""
        try:
            return admit()
        except Emptied:
            raise  # not refused: ended by a stop before its turn, as those waiting in line were
        except (MossTTSError, Refused) as err:
            raise self.refuse(interface, f"{refused_as}{err}") from None
        except Exception as exc:
            self._log.error(f"{interface} request failed to be checked:\n{traceback.format_exc()}")
            failed = f"the node failed to check the request ({type(exc).__name__}: {exc}); its log has the traceback"
            raise self.refuse(interface, f"{refused_as}{failed}") from None

    def _admit(
        self,
        interface: str,
        asked: Asked,
        request_id: str,
        start: Start,
        arrival: int,
        on_update: Callable[[Ticket[Job]], None] | None = None,
    ) -> Ticket[Job]:
        """Check a request and put it in line; raises Refused or MossTTSError with the reason, Emptied when a stop
        that empties the line came after it arrived. The check of a long text takes tens of milliseconds
        (docs/security.md, "Request checks"), hence the intake's thread."""
        check_serving(self._phase(), self._node)
        with self._model.borrow() as synth:
            if synth is None:  # deactivated and cleaned up since the state was read
                check_serving(Phase.UNCONFIGURED, self._node)
            settings, line = self.settings, self._line
            assert settings is not None and line is not None  # set before the model was lent and the node served
            speech = asked(synth)
            check_request(speech, settings.config.limits)  # bounded before its language is looked up and quoted
            settings.check_language(speech.language)
            cancel = threading.Event()
            stream, collected = start(synth, speech, settings, cancel)
        audio = AudioFormat(synth.sampling_rate, synth.channels)
        job = Job(stream, request_id, interface, settings.output_encoding, audio, collected)
        ticket = Ticket(job, cancel, on_update)
        with self._stopping:
            if arrival < self._emptied_before:
                raise Emptied(EMPTIED)
            line.submit(ticket)  # a line closed since the state was read refuses it with the reason it closed
        return ticket

    def _speak(self, ticket: Ticket[Job]) -> Outcome:
        """Run one request on the line's worker, publishing or keeping each chunk as it comes. A published one
        ends with one final chunk whatever ends it: the model's last, or an empty one that says why it stopped."""
        job = ticket.job
        job.started = time.monotonic()
        try:
            for chunk in job.stream:
                if job.collected is None:
                    ended = "" if chunk.stop_reason is None else chunk.stop_reason.value  # end or max_new_tokens
                    self._publish(job.request_id, chunk, job.encoding, ended)
                else:
                    job.collected.append(chunk.samples)
                job.chunks += 1
                job.audio_s = chunk.start_s + chunk.samples.shape[0] / chunk.sample_rate
                ticket.updated()
        except Exception:
            self._end_audio(job, AudioChunkMsg.END_REASON_ERROR)
            raise
        if job.stream.cancelled:
            self._end_audio(job, END_REASONS.get(ticket.cancel_reason, AudioChunkMsg.END_REASON_ERROR))
        report = job.stream.report
        assert report is not None  # set when the stream ends
        self._last = report
        if job.stream.cancelled:
            outcome = Outcome(False, ticket.cancel_reason)
        else:
            with self._counts:
                self._completed += 1
            outcome = Outcome(True, report.summary())
        self._log.info(f"request {job.request_id[:8]}: {outcome.message}")
        return outcome

    def _end_audio(self, job: Job, end_reason: str) -> None:
        """The empty final chunk of a published request that stopped before the model's final chunk."""
        if job.collected is None:
            closing = AudioChunk(job.audio.silence(0), job.audio.sample_rate, job.chunks, job.audio_s)
            self._publish(job.request_id, closing, job.encoding, end_reason)
            job.chunks += 1


class Emptied(Refused):
    """A request still being checked when a stop emptied the line: it ends as those waiting did, uncounted as
    refused (``str()`` is its reason)."""


def _named(job: Job) -> str:
    """A request as a stop's answer names it."""
    return f"the {job.interface} request {job.request_id[:8]}"


def _answered(
    response: Synthesize.Response, outcome: Outcome, job: Job | None, audio: AudioFormat, encoding: str
) -> Synthesize.Response:
    """``response`` filled in, the one place it is: the request's outcome and, when it ran (``job``), the audio it
    kept and its figures."""
    response.success, response.message = outcome.success, outcome.message
    response.sample_rate, response.channels, response.encoding = audio.sample_rate, audio.channels, encoding
    response.timing = timing_message(None, None)
    if job is not None:
        assert job.collected is not None  # a whole-utterance request keeps its samples
        samples = np.concatenate(job.collected) if job.collected else np.empty(0, np.float32)
        response.audio = encode(samples, encoding)  # (n, channels) row-major: interleaved
        response.duration = samples.shape[0] / audio.sample_rate
        response.timing = timing_message(job.stream.report, job.queue_wait_s)
    return response


def _asked(msg: Speak.Goal | Synthesize.Request | TextChunk, node: str, synth: Synthesizer) -> SpeechRequest:
    """A goal, a service request or a stream's first chunk as the synthesizer takes it, its voices looked up among
    the loaded model's (``node``, the node's full name, tells a refusal where they are listed)."""
    return speech_request(msg, *requested_voices(synth.voices, msg, node))


def _stream_asked(first: TextChunk, node: str, synth: Synthesizer) -> SpeechRequest:
    """A stream's request: its first chunk's fields, without text (the text arrives in the feed)."""
    return replace(_asked(first, node, synth), text="")


def _published(
    synth: Synthesizer, speech: SpeechRequest, settings: Settings, cancel: threading.Event
) -> tuple[AudioStream, None]:
    """A request whose chunks are published as they are decoded (``~/text``, a Speak goal)."""
    return synth.stream(speech, cancel=cancel, config=settings.config), None


def _whole(
    synth: Synthesizer, speech: SpeechRequest, settings: Settings, cancel: threading.Event
) -> tuple[AudioStream, list[np.ndarray]]:
    """A whole-utterance answer: the codec's offline decode, kept, at most ``max_response_seconds`` of it, and
    refused when it is expected to take longer."""
    limit = settings.max_response_seconds
    try:  # refused before its text is planned (docs/security.md, "Request checks")
        stream = synth.stream(
            speech, cancel=cancel, streaming=False, config=settings.config, max_audio_s=limit, max_expected_s=limit
        )
    except ExpectedTooLong as err:
        raise RequestError(
            f"the speech is expected to take {err.expected_s:.1f} s, more than a ~/synthesize response "
            f"holds (parameter 'max_response_seconds' ({limit:g} s)): split the text, or use ~/speak or ~/text, "
            "which stream it"
        ) from err
    return stream, []


def _fed(
    new: NewStream, synth: Synthesizer, speech: SpeechRequest, settings: Settings, cancel: threading.Event
) -> tuple[AudioStream, None]:
    """A text stream's request, spoken from its feed as the text arrives, published."""
    return synth.stream_text(new.feed, speech, cancel=cancel, config=settings.config), None
