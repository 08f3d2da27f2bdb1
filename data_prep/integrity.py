"""Truncated audio: a file whose header promises more audio than its data holds.

libsndfile decodes what is there without complaint (a WAV cut mid-data reads as a shorter WAV; an MP3 cut
mid-stream stops early), so a truncated file would slip into the shards as a shorter utterance whose
transcript no longer matches. We compare the decoded length with the length the container declares.
"""

from __future__ import annotations

import struct

import soundfile as sf

from data_prep import storage

TOLERANCE_SECONDS = 0.05  # encoder padding / decoder delay of lossy codecs
TOLERANCE_FRACTION = 0.01
# WAV writers that stream (pipes) leave the data size unknown: 0 or a placeholder near 2**31 or 2**32.
PLACEHOLDER_WAV_BYTES = 0x7FFFFFFF - 1024
HEADER_PROBE_BYTES = 4096  # WAV headers (fmt + a few metadata chunks) fit; others go to libsndfile
RIFF_HEADER_BYTES, CHUNK_HEADER_BYTES = 12, 8  # "RIFF" size "WAVE"; chunk id + size
FMT_FIELDS = struct.Struct("<HHIIH")  # format tag, channels, sample rate, byte rate, block align
UNCOMPRESSED_WAV_TAGS = (1, 3, 0xFFFE)  # PCM, IEEE float, extensible


def declared_seconds(audio: str) -> float | None:
    """Seconds of audio the file's header declares; None when it declares nothing trustworthy."""
    src = storage.open_input(audio)
    try:
        head = _read_head(src)
        if head[:4] == b"RIFF" and head[8:12] == b"WAVE":
            return _wav_declared(
                head
            )  # NOTE: libsndfile reports a WAV's frames actually present, not declared
        if not isinstance(src, str):
            src.seek(0)
        info = sf.info(src)
        return info.frames / info.samplerate if info.frames > 0 else None
    except (sf.LibsndfileError, RuntimeError, OSError):
        return None
    finally:
        if not isinstance(src, str):
            src.close()


def _read_head(src) -> bytes:
    if isinstance(src, str):
        with open(src, "rb") as f:
            return f.read(HEADER_PROBE_BYTES)
    return src.read(HEADER_PROBE_BYTES)


def _wav_declared(head: bytes) -> float | None:
    """Data-chunk size / block size of an uncompressed RIFF WAV; None when compressed, unknown or streamed."""
    pos, fmt = RIFF_HEADER_BYTES, None
    while pos + CHUNK_HEADER_BYTES <= len(head):
        chunk, size = head[pos : pos + 4], int.from_bytes(head[pos + 4 : pos + 8], "little")
        body = pos + CHUNK_HEADER_BYTES
        if chunk == b"fmt " and body + FMT_FIELDS.size <= len(head):
            tag, _channels, rate, _byte_rate, block = FMT_FIELDS.unpack_from(head, body)
            fmt = (tag, rate, block)
        elif chunk == b"data":
            if fmt is None or fmt[0] not in UNCOMPRESSED_WAV_TAGS or not (fmt[1] and fmt[2]):
                return None
            return None if size == 0 or size >= PLACEHOLDER_WAV_BYTES else size // fmt[2] / fmt[1]
        pos = body + size + (size & 1)  # chunks are padded to even sizes
    return None


def is_truncated(decoded_seconds: float, expected_seconds: float | None) -> bool:
    """True when the decoded audio falls short of what was expected by more than codec slack."""
    if expected_seconds is None:
        return False
    slack = max(TOLERANCE_SECONDS, TOLERANCE_FRACTION * expected_seconds)
    return decoded_seconds < expected_seconds - slack
