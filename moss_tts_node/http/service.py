"""The HTTP server's requests from their check to their audio: the same intake and line as the ROS node's
(``serving/``), over one synthesizer.

The event loop never checks nor synthesizes: a request's check (its text cleaned, tokenized and planned; tens of
milliseconds) runs on the intake's thread, one at a time in the order requests arrived, at most
``CHECKS_WAITING`` waiting; its synthesis waits in a bounded line whose worker runs one at a time. The worker
hands each chunk to the response through an ``Audio`` channel, which never blocks it: a slow client holds its
own chunks, not the line. A client that goes away cancels its request (within one step while it is spoken, at
once while it waits); ``close`` ends them all.

No web framework here: ``http/server.py`` is the ASGI layer, ``test/test_http.py`` drives both.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

from moss_tts_node.errors import ExpectedTooLong, RequestError
from moss_tts_node.http.api import Order
from moss_tts_node.serving.intake import CHECKS_WAITING, Intake
from moss_tts_node.serving.queue import Outcome, RequestQueue, Ticket
from moss_tts_node.synthesis.results import AudioChunk, AudioStream
from moss_tts_node.synthesizer import Synthesizer
from moss_tts_node.timing import TimingReport

CLIENT_GONE = "the client closed the connection"
SHUTTING_DOWN = "the server is shutting down"

log = logging.getLogger("moss_tts_node.http")
T = TypeVar("T")


Item = AudioChunk | TimingReport | Outcome


class Audio:
    """One request's audio, from the line's worker thread to its response on the event loop: each chunk as it is
    decoded (its samples at its rate and channels: the response encodes them), the stream's report once it has
    ended well, then the Outcome."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: asyncio.Queue[Item] = asyncio.Queue()

    def put(self, item: Item) -> None:
        """From any thread; never waits."""
        self._loop.call_soon_threadsafe(self._items.put_nowait, item)

    async def get(self) -> Item:
        return await self._items.get()


@dataclass
class Job:
    """A checked request as the line runs it: its stream, and where its audio goes."""

    stream: AudioStream
    audio: Audio


class SpeechService:
    """The server's synthesizer, intake and line; ``max_response_s`` bounds a whole (not streamed) body, which is
    held until it is sent, as ``max_response_seconds`` bounds a ROS ``~/synthesize`` response."""

    def __init__(self, synth: Synthesizer, queue_size: int, max_response_s: float) -> None:
        self.synth = synth
        self.max_response_s = max_response_s
        self._intake = Intake(CHECKS_WAITING)
        self._line: RequestQueue[Job] = RequestQueue(self._speak, queue_size)

    def submit(self, order: Order, audio: Audio) -> Future[Ticket[Job]]:
        """Hand a request's check to the intake: the future of its place in line, or of its refusal (Refused,
        RequestError). Raises Refused when the intake is full."""
        return self._intake.submit(lambda: self._admit(order, audio))

    def run_checked(self, work: Callable[[], T]) -> Future[T]:
        """Run ``work`` (an upload's decode and encode) on the intake's thread, in turn with the requests' checks:
        the future of its result. Raises Refused when the intake is full."""
        return self._intake.submit(work)

    def cancel(self, ticket: Ticket[Job], reason: str) -> None:
        self._line.cancel(ticket, reason)

    def close(self, reason: str = SHUTTING_DOWN) -> None:
        """Refuse new requests, end those in line with ``reason`` (the one spoken within one step)."""
        self._intake.close(reason)
        self._line.close(reason)

    def _admit(self, order: Order, audio: Audio) -> Ticket[Job]:
        """On the intake's thread: check the request (``Synthesizer.stream`` raises before anything is generated)
        and put it in line."""
        cancel = threading.Event()
        if order.stream:
            stream = self.synth.stream(order.request, cancel=cancel)
        else:
            limit = self.max_response_s
            try:
                stream = self.synth.stream(
                    order.request, cancel=cancel, streaming=False, max_audio_s=limit, max_expected_s=limit
                )
            except ExpectedTooLong as err:
                raise RequestError(
                    f"the speech is expected to take {err.expected_s:.1f} s, more than a whole response holds "
                    f"(--max-response-seconds {limit:g}): split the text, or stream it (stream true)"
                ) from err
        ticket = Ticket(Job(stream, audio), cancel, _ended)
        self._line.submit(ticket)
        return ticket

    def _speak(self, ticket: Ticket[Job]) -> Outcome:
        """On the line's worker: the stream's chunks to the response as they come; its outcome (which the ticket's
        end hands the response, ``_ended``)."""
        job = ticket.job
        for chunk in job.stream:
            job.audio.put(chunk)
        report = job.stream.report
        assert report is not None  # set when the stream ends
        if job.stream.cancelled:
            return Outcome(False, ticket.cancel_reason)
        job.audio.put(report)
        return Outcome(True, report.summary())


def _ended(ticket: Ticket[Job]) -> None:
    """A ticket's update: once it has ended (spoken, failed, cancelled, dropped or closed), its outcome goes to its
    response, the last item of its audio."""
    outcome = ticket.outcome
    if outcome is not None:
        ticket.job.audio.put(outcome)
        log.info(f"request {'spoken' if outcome.success else 'ended'}: {outcome.message}")
