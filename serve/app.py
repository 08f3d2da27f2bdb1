"""FastAPI app factory: an OpenAI-compatible transcription API, health, metrics and a web page.

    app = create_app(ServeConfig(model="runs/demo/model.pt"))

The model is loaded once; requests are decoded and featurized in the thread pool, then grouped into
micro-batches that run the model (gradient-free) in one worker thread.
"""

from __future__ import annotations

import hmac
import io
import os
import time
from contextlib import asynccontextmanager
from pathlib import Path

import soundfile as sf
import torch
from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from asr.audio import AudioError, FeatureConfig, featurize
from asr.bundle import Bundle, load_bundle
from asr.longform import Transcriber, Transcript
from serve.batcher import MicroBatcher
from serve.config import ServeConfig
from serve.limits import BodyLimitMiddleware
from serve.metrics import CONTENT_TYPE, Metrics
from serve.responses import RESPONSE_FORMATS, APIError, error_response, transcription_response

STATIC_DIR = Path(__file__).parent / "static"
TRANSCRIPTIONS = "/v1/audio/transcriptions"
SUPPORTED_AUDIO = "wav, flac, ogg or mp3"
MAX_CAUSE_DEPTH = 8
HTTP_CODES = {400: "invalid_request", 404: "not_found", 405: "method_not_allowed"}


class ServerState:
    """What the routes share: config, model id, transcriber, batcher, metrics."""

    def __init__(self, cfg: ServeConfig, bundle: Bundle):
        self.cfg, self.bundle = cfg, bundle
        self.model_id = cfg.model_id or Path(cfg.model).stem
        self.transcriber = Transcriber.from_bundle(
            bundle, cfg.decoding, chunking=cfg.chunking, max_batch=cfg.max_batch_size
        )
        self.metrics = Metrics()
        self.api_key = os.environ.get(cfg.api_key_env) or None
        self.batcher: MicroBatcher[tuple[torch.Tensor, float], Transcript] | None = None
        self.created = int(time.time())


def create_app(cfg: ServeConfig, bundle: Bundle | None = None) -> FastAPI:
    """Build the app for ``cfg``; ``bundle`` (already loaded) overrides loading ``cfg.model``."""
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    state = ServerState(cfg, bundle or load_bundle(cfg.model, cfg.device))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.batcher = MicroBatcher(state.transcriber, cfg.max_batch_size, cfg.max_wait_ms)
        state.batcher.start()
        yield
        await state.batcher.close()

    app = FastAPI(title="ASR transcription API", version="1", lifespan=lifespan)
    app.state.asr = state
    _add_error_handlers(app, state.metrics)
    _add_auth_middleware(app, state)
    _add_metrics_middleware(app, state.metrics)  # NOTE: added after, so it wraps (and counts) the 401s
    app.add_middleware(BodyLimitMiddleware, max_bytes=cfg.max_upload_bytes, on_reject=state.metrics)
    _add_routes(app, state)
    return app


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", media_type="text/html")

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok", "model": state.model_id}

    @app.get("/metrics")
    async def metrics() -> Response:
        b = state.batcher
        text = state.metrics.render(b.batches if b else 0, b.batched_items if b else 0)
        return PlainTextResponse(text, media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model_card(state)]}

    @app.get("/v1/models/{model_id}")
    async def model(model_id: str) -> dict:
        if model_id != state.model_id:
            raise APIError(404, f"The model '{model_id}' does not exist", "model_not_found", param="model")
        return _model_card(state)

    @app.post(TRANSCRIPTIONS)
    async def transcriptions(
        file: UploadFile = File(...),  # noqa: B008 (FastAPI's declaration style)
        model: str = Form(""),  # NOTE: any name is accepted, so clients configured for "whisper-1" work
        language: str | None = Form(None),
        prompt: str | None = Form(None),  # accepted and ignored: a CTC model takes no prompt
        response_format: str = Form("json"),
        temperature: float = Form(0.0),  # accepted and ignored: CTC decoding does not sample
    ) -> Response:
        _check_params(response_format, temperature)
        with state.batcher.expecting():
            data = await file.read()
            await file.close()
            feature, limit = state.bundle.feature, state.cfg.max_audio_s
            feats, duration = await run_in_threadpool(decode_upload, data, feature, limit)
            del data
        transcript = await state.batcher.submit((feats, duration))
        state.metrics.observe_audio(duration)
        return transcription_response(transcript, response_format, language or state.cfg.language)


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_id, "object": "model", "created": state.created, "owned_by": "asr-pipeline"}


def _add_auth_middleware(app: FastAPI, state: ServerState) -> None:
    """With an API key configured, /v1/ requests need ``Authorization: Bearer KEY`` (checked before the body
    is read, so an unauthenticated upload costs nothing)."""

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        if state.api_key is None or not request.url.path.startswith("/v1/"):
            return await call_next(request)
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), state.api_key.encode()):
            return await call_next(request)
        state.metrics.observe_error("invalid_api_key")
        message = "Incorrect or missing API key (Authorization: Bearer ...)"
        return error_response(401, message, "invalid_api_key", "invalid_request_error")


def _check_params(response_format: str, temperature: float) -> None:
    if response_format not in RESPONSE_FORMATS:
        raise APIError(
            400,
            f"response_format must be one of {', '.join(RESPONSE_FORMATS)}",
            "invalid_value",
            param="response_format",
        )
    if not 0.0 <= temperature <= 1.0:
        raise APIError(400, "temperature must be between 0 and 1", "invalid_value", param="temperature")


def decode_upload(data: bytes, feature: FeatureConfig, max_audio_s: float) -> tuple[torch.Tensor, float]:
    """Uploaded bytes -> ([T, D] features, duration s); APIError (400/415) for audio we cannot or will not use."""
    if not data:
        raise APIError(400, "The uploaded file is empty", "empty_file", param="file")
    try:
        info = sf.info(io.BytesIO(data))
    except Exception as e:  # NOTE: libsndfile raises several types for unknown formats
        raise APIError(
            415,
            f"Unsupported or unrecognized audio format; send {SUPPORTED_AUDIO}",
            "unsupported_audio_format",
        ) from e
    if info.samplerate > 0 and info.frames / info.samplerate > max_audio_s:
        raise APIError(
            400, f"Audio is longer than the {max_audio_s:g} s limit", "audio_too_long", param="file"
        )
    try:
        feats, duration = featurize(data, feature)
    except AudioError as e:
        raise APIError(400, f"Invalid audio: {e}", "invalid_audio", param="file") from e
    if duration > max_audio_s:
        raise APIError(
            400, f"Audio is longer than the {max_audio_s:g} s limit", "audio_too_long", param="file"
        )
    return feats, duration


def _add_error_handlers(app: FastAPI, metrics: Metrics) -> None:
    def respond(status: int, message: str, code: str, type_: str, param=None) -> JSONResponse:
        metrics.observe_error(code)
        return error_response(status, message, code, type_, param)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        return respond(exc.status_code, exc.detail, exc.code, exc.type, exc.param)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if (cause := _api_error_cause(exc)) is not None:  # e.g. the upload limit hit while parsing the form
            return respond(cause.status_code, cause.detail, cause.code, cause.type, cause.param)
        code = HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        return respond(exc.status_code, str(exc.detail), code, "invalid_request_error")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = str(first.get("loc", ["", ""])[-1])
        return respond(
            400,
            f"Invalid parameter {param}: {first.get('msg', 'invalid')}",
            "invalid_value",
            "invalid_request_error",
            param,
        )

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        return respond(500, "Internal server error", "server_error", "server_error")


def _api_error_cause(exc: BaseException | None) -> APIError | None:
    """The APIError that ``exc`` wraps (FastAPI turns errors raised while parsing a body into a plain 400)."""
    seen = 0
    while exc is not None and seen < MAX_CAUSE_DEPTH:
        if isinstance(exc, APIError):
            return exc
        if isinstance(getattr(exc, "exceptions", None), tuple):  # an ExceptionGroup (Python 3.11+)
            return next(filter(None, map(_api_error_cause, exc.exceptions)), None)
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def _add_metrics_middleware(app: FastAPI, metrics: Metrics) -> None:
    @app.middleware("http")
    async def count_requests(request: Request, call_next):
        start, path = time.perf_counter(), request.url.path
        transcribing = path == TRANSCRIPTIONS
        metrics.in_flight += transcribing
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            metrics.in_flight -= transcribing
            endpoint = path if path in _KNOWN_PATHS else "other"  # NOTE: bounded label values
            metrics.observe_request(endpoint, status, time.perf_counter() - start)


_KNOWN_PATHS = {"/", "/healthz", "/metrics", "/v1/models", TRANSCRIPTIONS}
