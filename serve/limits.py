"""Upload size limit as ASGI middleware: oversized bodies get 413 before anything buffers them."""

from __future__ import annotations

from serve.metrics import Metrics
from serve.responses import APIError, error_response

DRAIN_LIMIT_BYTES = (
    256 * 1024 * 1024
)  # NOTE: read (and drop) this much of a rejected body so the client sees the 413
TOO_LARGE = "request_too_large"


class BodyLimitMiddleware:
    """Rejects requests whose body exceeds ``max_bytes`` with 413 and an OpenAI-style error body.

    Declared sizes (Content-Length) are rejected up front; undeclared (chunked) bodies are counted as they
    stream in and the request is failed as soon as the count passes the limit.
    """

    def __init__(self, app, max_bytes: int, on_reject: Metrics | None = None):
        self.app, self.max_bytes, self.metrics = app, max_bytes, on_reject

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await _drain(receive)
            return await self._reject(scope, receive, send)
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise APIError(
                    413, self._message(), TOO_LARGE
                )  # FastAPI re-raises HTTPExceptions from parsing
            return message

        await self.app(scope, counting_receive, send)

    def _message(self) -> str:
        return f"Request body exceeds the {self.max_bytes / 1024 / 1024:g} MB upload limit"

    async def _reject(self, scope, receive, send) -> None:
        if self.metrics is not None:
            self.metrics.observe_error(TOO_LARGE)
            self.metrics.observe_request(
                "other" if scope["path"] != "/v1/audio/transcriptions" else scope["path"], 413, 0.0
            )
        await error_response(413, self._message(), TOO_LARGE, "invalid_request_error")(scope, receive, send)


async def _drain(receive) -> None:
    """Read and discard the request body (up to DRAIN_LIMIT_BYTES) without keeping it."""
    seen = 0
    while seen <= DRAIN_LIMIT_BYTES:
        message = await receive()
        seen += len(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return
