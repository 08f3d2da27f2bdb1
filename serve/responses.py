"""OpenAI-compatible response bodies: transcription formats (json, text, verbose_json, srt, vtt) and errors."""

from __future__ import annotations

from fastapi import HTTPException
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from asr.longform import Segment, Transcript

RESPONSE_FORMATS = ("json", "text", "verbose_json", "srt", "vtt")


class APIError(HTTPException):
    """An error answered with OpenAI's body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(
        self, status: int, message: str, code: str, type_: str = "invalid_request_error", param=None
    ):
        super().__init__(status_code=status, detail=message)
        self.code, self.type, self.param = code, type_, param


def error_response(status: int, message: str, code: str, type_: str, param=None) -> JSONResponse:
    """OpenAI's error body with ``status`` (401s also carry WWW-Authenticate)."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


def transcription_response(t: Transcript, response_format: str, language: str) -> Response:
    """Render ``t`` the way OpenAI's /v1/audio/transcriptions does for ``response_format``."""
    if response_format == "json":
        return JSONResponse({"text": t.text})
    if response_format == "text":
        return PlainTextResponse(t.text + "\n")
    if response_format == "verbose_json":
        return JSONResponse(verbose_json(t, language))
    if response_format == "srt":
        return PlainTextResponse(srt(t.segments), media_type="application/x-subrip")
    return PlainTextResponse(vtt(t.segments), media_type="text/vtt")


def verbose_json(t: Transcript, language: str) -> dict:
    """OpenAI's verbose_json body; fields a CTC model has no value for (temperature, ...) get neutral ones."""
    return {
        "task": "transcribe",
        "language": language,
        "duration": round(t.duration, 3),
        "text": t.text,
        "segments": [_segment_json(s) for s in t.segments],
    }


def _segment_json(s: Segment) -> dict:
    return {
        "id": s.id,
        "seek": 0,
        "start": s.start,
        "end": s.end,
        "text": s.text,
        "tokens": list(s.tokens),
        "temperature": 0.0,
        "avg_logprob": 0.0,
        "compression_ratio": 1.0,
        "no_speech_prob": 0.0,
    }


def timestamp(seconds: float, decimal: str) -> str:
    """3725.5 -> "01:02:05,500" (srt, decimal=",") or "01:02:05.500" (vtt, decimal=".")."""
    ms = round(seconds * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{decimal}{ms:03d}"


def srt(segments: tuple[Segment, ...]) -> str:
    """SubRip: numbered cues from 1, blank line after each."""
    return "".join(
        f"{i}\n{timestamp(s.start, ',')} --> {timestamp(s.end, ',')}\n{s.text}\n\n"
        for i, s in enumerate(segments, start=1)
    )


def vtt(segments: tuple[Segment, ...]) -> str:
    """WebVTT: header, then one cue per segment."""
    cues = "".join(f"{timestamp(s.start, '.')} --> {timestamp(s.end, '.')}\n{s.text}\n\n" for s in segments)
    return "WEBVTT\n\n" + cues
