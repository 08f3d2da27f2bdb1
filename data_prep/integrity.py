"""Truncated audio: a file whose header promises more audio than its data holds.

libsndfile decodes what is there without complaint (a WAV cut mid-data reads as a shorter WAV; an MP3 cut
mid-stream stops early), so a truncated file would slip into the shards as a shorter utterance whose
transcript no longer matches. We compare the decoded length with the length the container declares.
"""

from __future__ import annotations

import wave

import soundfile as sf

from data_prep import storage

TOLERANCE_SECONDS = 0.05  # encoder padding / decoder delay of lossy codecs
TOLERANCE_FRACTION = 0.01
# WAV writers that stream (pipes) leave the data size unknown: 0 or a placeholder near 2**31 or 2**32.
PLACEHOLDER_WAV_BYTES = 0x7FFFFFFF - 1024


def declared_seconds(audio: str) -> float | None:
    """Seconds of audio the file's header declares; None when it declares nothing trustworthy."""
    src = storage.open_input(audio)
    try:
        seconds = _wav_declared(src)
        if seconds is None:
            if not isinstance(src, str):
                src.seek(0)
            info = sf.info(src)
            seconds = info.frames / info.samplerate if info.frames > 0 else None
        return seconds
    except (sf.LibsndfileError, RuntimeError, OSError):
        return None
    finally:
        if not isinstance(src, str):
            src.close()


def _wav_declared(src) -> float | None:
    """PCM WAV data-chunk size / frame size (libsndfile itself reports the frames actually present)."""
    try:
        with wave.open(src) as w:  # a path is closed on exit; a file object is left to the caller
            nbytes = w.getnframes() * w.getnchannels() * w.getsampwidth()
            if nbytes == 0 or nbytes >= PLACEHOLDER_WAV_BYTES:
                return None
            return w.getnframes() / w.getframerate()
    except (wave.Error, EOFError):
        return None


def is_truncated(decoded_seconds: float, expected_seconds: float | None) -> bool:
    """True when the decoded audio falls short of what was expected by more than codec slack."""
    if expected_seconds is None:
        return False
    slack = max(TOLERANCE_SECONDS, TOLERANCE_FRACTION * expected_seconds)
    return decoded_seconds < expected_seconds - slack
