"""What a long command is doing: the status line the commands draw while they work (synth, batch, convert).

Shared by ``cli/`` and ``prepare/``, so it sits beside them rather than in either.
"""

from __future__ import annotations

import time
from typing import TextIO


class Progress:
    """One self-rewriting status line on a terminal, and lines of their own (``message``).

    ``stream``: where it all goes (None: nowhere). Off a terminal (a pipe, a
    log file) the status line is not drawn, except that with ``log_tenths`` a ``fraction`` prints a line each time
    it passes another tenth, so that a log of a long job shows it moving.
    """

    BAR_WIDTH = 24

    def __init__(self, stream: TextIO | None, *, log_tenths: bool = False) -> None:
        self.stream = stream
        self.started = time.perf_counter()
        self.enabled = self.stream is not None and self.stream.isatty()  # the status line is drawn
        self.log_tenths = log_tenths
        self._shown = 0  # length of the line on screen, so a shorter one overwrites all of it
        self._tenths = 0  # tenths a fraction has passed since the last message (off a terminal)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def show(self, audio_seconds: float) -> None:
        self._draw(f"generating: {audio_seconds:6.2f} s of audio in {self.elapsed():6.2f} s")

    def bar(self, done: int, total: int, eta_s: float | None, note: str = "") -> None:
        """``done`` of ``total`` items as a bar, with the time left (``None``: not known yet)."""
        filled = self.BAR_WIDTH * done // total if total else self.BAR_WIDTH
        eta = "--:--" if eta_s is None else format_duration(eta_s)
        self._draw(f"[{'#' * filled}{'.' * (self.BAR_WIDTH - filled)}] {done}/{total} ETA {eta} {note}".rstrip())

    def fraction(self, done: float, total: float, line: str) -> None:
        """``line`` tells how far a job of ``total`` units is (``done`` of them): drawn on a terminal, else
        printed once per tenth passed when ``log_tenths``."""
        if self.enabled:
            self._draw(line)
            return
        tenths = int(10 * done / max(total, 1))
        if self.log_tenths and self.stream is not None and tenths > self._tenths:
            self._tenths = tenths
            print(line, file=self.stream, flush=True)

    def message(self, text: str) -> None:
        """A line of its own, shown whether or not the status line is; the status line is redrawn by the next
        update, and a fraction counts its tenths anew."""
        self._tenths = 0
        if self.stream is None:
            return
        if self.enabled and self._shown:
            print("\r" + " " * self._shown + "\r", end="", file=self.stream)
            self._shown = 0
        print(text, file=self.stream, flush=True)

    def done(self) -> None:
        if self.enabled and self._shown:
            print(file=self.stream)
            self._shown = 0

    def _draw(self, line: str) -> None:
        if self.enabled:
            print("\r" + line.ljust(self._shown), end="", file=self.stream, flush=True)
            self._shown = len(line)


def format_duration(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
