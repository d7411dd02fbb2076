"""The models this package runs, and what each needs: the MossTTSDelay family and MOSS-TTS-Nano.

One record per model (docs/family.md and docs/nano.md have where each fact was read): its name, its architecture
(``DELAY``: a Qwen3 backbone and the delay pattern; ``NANO``: a global and a local GPT-2-style transformer, a frame a
step), the codebook counts its checkpoint may have (``n_vq``; read from the checkpoint, never assumed, and refused
where it is not one of these), and the sampling upstream recommends for it, which applies where the config leaves a
sampling key at -1 (``config.py``, ``sampling``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RecommendedSampling:
    """A model's recommended sampling, by the keys of the config's ``sampling`` section."""

    text_temperature: float
    text_top_k: int
    text_top_p: float
    audio_temperature: float
    audio_top_k: int
    audio_top_p: float
    audio_repetition_penalty: float


# Text sampling is upstream's generate() defaults for every model: no card or app of the family sets it.
_TEXT = {"text_temperature": 1.5, "text_top_k": 50, "text_top_p": 1.0}

DELAY = "delay"
NANO = "nano"


@dataclass(frozen=True)
class FamilyModel:
    """One model of the family. ``key`` names it in ``convert --model`` and in the weights' record."""

    key: str
    name: str
    codebooks: tuple[int, ...]  # the n_vq its checkpoints may have
    sampling: RecommendedSampling
    use: str  # what it is for, in a few words
    # A dialogue model: a text longer than one generation is cut between speaker turns, and each piece continues
    # the audio of the piece before it (docs/family.md, "Dialogues").
    dialogue: bool = False
    architecture: str = DELAY


MOSS_TTS = FamilyModel(
    "moss-tts",
    "MOSS-TTS",
    (32,),
    RecommendedSampling(**_TEXT, audio_temperature=1.7, audio_top_k=25, audio_top_p=0.8, audio_repetition_penalty=1.0),
    "speech from text, in a voice cloned from a clip",
)
MOSS_TTSD = FamilyModel(
    "moss-ttsd",
    "MOSS-TTSD",
    (16,),
    RecommendedSampling(**_TEXT, audio_temperature=1.1, audio_top_k=50, audio_top_p=0.9, audio_repetition_penalty=1.1),
    "dialogues of 1 to 5 speakers, continuing their clips",
    dialogue=True,
)
VOICE_GENERATOR = FamilyModel(
    "voice-generator",
    "MOSS-VoiceGenerator",
    (16, 32),  # ports that read its config.json say 16; one says 32; upstream's card gives no count
    RecommendedSampling(**_TEXT, audio_temperature=1.5, audio_top_k=50, audio_top_p=0.6, audio_repetition_penalty=1.1),
    "speech in a voice designed from a description, no clip needed",
)
SOUND_EFFECT = FamilyModel(
    "sound-effect",
    "MOSS-SoundEffect",
    (16,),
    RecommendedSampling(**_TEXT, audio_temperature=1.5, audio_top_k=50, audio_top_p=0.6, audio_repetition_penalty=1.2),
    "ambient sound and sound effects from a description",
)
# Sampling as upstream's Nano runtimes default it (ort_cpu_runtime.py, moss_tts_nano_runtime.py); its PyTorch
# generate() has other defaults, which no app of upstream's uses (docs/nano.md, "Sampling").
MOSS_TTS_NANO = FamilyModel(
    "nano",
    "MOSS-TTS-Nano",
    (16,),
    RecommendedSampling(
        text_temperature=1.0,
        text_top_k=50,
        text_top_p=1.0,
        audio_temperature=0.8,
        audio_top_k=25,
        audio_top_p=0.95,
        audio_repetition_penalty=1.2,
    ),
    "real-time speech on a CPU (0.1B, 48 kHz stereo), in a voice cloned from a clip",
    architecture=NANO,
)
FAMILY: dict[str, FamilyModel] = {
    model.key: model for model in (MOSS_TTS, MOSS_TTSD, VOICE_GENERATOR, SOUND_EFFECT, MOSS_TTS_NANO)
}
# The models of the MossTTSDelay architecture: the ones a Qwen3 checkpoint may be.
DELAY_FAMILY: dict[str, FamilyModel] = {key: model for key, model in FAMILY.items() if model.architecture == DELAY}
