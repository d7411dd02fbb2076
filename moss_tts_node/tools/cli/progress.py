"""The status line the user's commands draw on a terminal while they work (synth, batch)."""

from __future__ import annotations

import sys
import time


class Progress:
    """One self-rewriting status line on a terminal; silent when stderr is a pipe or file."""

    BAR_WIDTH = 24

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.enabled = sys.stderr.isatty()
        self._shown = 0  # length of the line on screen, so a shorter one overwrites all of it

    def show(self, audio_seconds: float) -> None:
        elapsed = time.perf_counter() - self.started
        self._draw(f"generating: {audio_seconds:6.2f} s of audio in {elapsed:6.2f} s")

    def bar(self, done: int, total: int, eta_s: float | None, note: str = "") -> None:
        """``done`` of ``total`` items as a bar, with the time left (``None``: not known yet)."""
        filled = self.BAR_WIDTH * done // total if total else self.BAR_WIDTH
        eta = "--:--" if eta_s is None else format_duration(eta_s)
        self._draw(f"[{'#' * filled}{'.' * (self.BAR_WIDTH - filled)}] {done}/{total} ETA {eta} {note}".rstrip())

    def message(self, text: str) -> None:
        """A line of its own on stderr, shown whether or not the status line is; the status line is
        redrawn by the next update."""
        if self.enabled and self._shown:
            print("\r" + " " * self._shown + "\r", end="", file=sys.stderr)
            self._shown = 0
        print(text, file=sys.stderr)

    def done(self) -> None:
        if self.enabled and self._shown:
            print(file=sys.stderr)
            self._shown = 0

    def _draw(self, line: str) -> None:
        if self.enabled:
            print("\r" + line.ljust(self._shown), end="", file=sys.stderr, flush=True)
            self._shown = len(line)


def format_duration(seconds: float) -> str:
    """``m:ss``, or ``h:mm:ss`` from an hour on."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
