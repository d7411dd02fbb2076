"""The node's model: loaded by configure, lent to the requests' checks, freed by cleanup, its memory given back
(docs/ros.md, "Lifecycle").

No node: the transitions of ros/node.py call it, and ``test/test_ros_requests.py`` loads and frees one without a
middleware.
"""

from __future__ import annotations

import threading
import time
import traceback

from moss_tts_node.audio_output import AudioFormat
from moss_tts_node.backends import open_synthesizer
from moss_tts_node.choices import BACKEND_REMOTE
from moss_tts_node.errors import MossTTSError
from moss_tts_node.ros.heap import release_freed_memory, resident_mib
from moss_tts_node.ros.lifecycle import Loan
from moss_tts_node.ros.parameters import Settings
from moss_tts_node.ros.requests import Log
from moss_tts_node.synthesizer import Synthesizer


class LoadedModel:
    """The synthesizer a configure loads (the model and its voices), lent through ``loan`` until cleanup frees it.

    ``failure`` says why the last configure failed, until one succeeds; ``audio`` (the format its audio is given out
    in), ``load_s``, ``name``, ``weight_layout`` and ``loaded`` describe the model the last successful one loaded.
    """

    def __init__(self, log: Log) -> None:
        self.loan: Loan[Synthesizer] = Loan()  # lent to the threads that check a request with it
        self.audio = AudioFormat(0, 0)
        self.load_s: float | None = None
        self.name = ""  # which model of the family it is (``ModelIdentity.name``: "MOSS-VoiceGenerator")
        self.weight_layout = ""  # where llama.cpp keeps its weights, and why (``Backbone.weight_layout``)
        self.loaded = ""  # "model loaded in ... from ... (name)", for the log
        self.failure: str | None = None
        self._log = log

    def load(self, settings: Settings) -> None:
        """Load the model the settings name and prepare its configured voice (the first request prefills only its
        text); raises what failed, with nothing left loaded."""
        started = time.monotonic()
        synth = open_synthesizer(settings.config)
        try:
            synth.prepare_voice()
        except BaseException:
            synth.close()
            raise
        self.failure = None
        self.audio = AudioFormat(synth.sampling_rate, synth.channels)
        self.load_s = time.monotonic() - started
        self.name = synth.name
        self.weight_layout = synth.weight_layout
        model = settings.config.model
        source = model.remote_url if model.backend == BACKEND_REMOTE else model.weights_dir
        self.loaded = f"model loaded in {self.load_s:.1f} s from {source} ({self.name})"
        self.loan.give(synth)

    def failed(self, err: Exception) -> str:
        """A configure failed with ``err``: its reason, kept in ``failure``. An unexpected error's traceback is
        logged; what a half-made model held is given back."""
        expected = isinstance(err, MossTTSError)
        self.failure = str(err) if expected else f"{type(err).__name__}: {err}"
        release_freed_memory()
        if not expected:
            self._log.error(traceback.format_exc())
        return self.failure

    def apply(self, settings: Settings, voice_changed: bool) -> None:
        """New parameters: what the synthesizer reads on its own (the default voice); when the generation
        defaults changed (``voice_changed``), the prompt prefix they give is prefilled off the caller's thread
        (preparing waits for the request being spoken to end)."""
        with self.loan.borrow() as synth:
            if synth is not None:
                synth.reconfigure(settings.config)
        if voice_changed:
            threading.Thread(target=self._prepare_voice, name="prepare-voice", daemon=True).start()

    def free(self) -> None:
        """Free the model once no callback holds it, and give its memory back to the system."""
        started, before = time.monotonic(), resident_mib()
        synth = self.loan.take_back()
        if synth is not None:
            synth.close()
        del synth
        release_freed_memory()
        after = resident_mib()
        memory = "" if before is None or after is None else f": resident memory {before:.0f} -> {after:.0f} MiB"
        self._log.info(f"unconfigured: model freed in {time.monotonic() - started:.2f} s{memory}")

    def _prepare_voice(self) -> None:
        """Prefill the prompt prefix the new generation defaults give (nothing when it is already there)."""
        with self.loan.borrow() as synth:
            if synth is None:
                return  # freed meanwhile: the next configure prepares it
            try:
                rows = synth.prepare_voice()
            except MossTTSError as err:
                self._log.warning(f"could not prepare the voice for the new generation defaults: {err}")
                return
        if rows:
            self._log.info(f"voice prepared: {rows} prompt rows prefilled for the new generation defaults")
