"""Prometheus text-format metrics (exposition format 0.0.4), kept in-process without a global registry."""

from __future__ import annotations

import threading
from collections import defaultdict

LATENCY_BUCKETS_S = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PREFIX = "asr"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """Request counts, errors, latency histogram and audio seconds of the transcription endpoint."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = defaultdict(int)  # (endpoint, status) -> count
        self.errors: dict[str, int] = defaultdict(int)  # error code -> count
        self.latency_counts = [0] * (len(LATENCY_BUCKETS_S) + 1)  # per bucket, last = +Inf
        self.latency_sum = 0.0
        self.audio_seconds = 0.0
        self.in_flight = 0

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        """Count a finished request and its latency."""
        with self._lock:
            self.requests[(endpoint, status)] += 1
            if endpoint.startswith("/v1/audio"):
                i = next((i for i, b in enumerate(LATENCY_BUCKETS_S) if seconds <= b), len(LATENCY_BUCKETS_S))
                self.latency_counts[i] += 1
                self.latency_sum += seconds

    def observe_error(self, code: str) -> None:
        """Count an error response by its OpenAI-style code."""
        with self._lock:
            self.errors[code] += 1

    def observe_audio(self, seconds: float) -> None:
        """Add transcribed audio seconds."""
        with self._lock:
            self.audio_seconds += seconds

    def render(self, batches: int = 0, batched_items: int = 0) -> str:
        """The metrics page."""
        with self._lock:
            lines = _counter("requests_total", "HTTP requests by endpoint and status.")
            for (endpoint, status), n in sorted(self.requests.items()):
                lines.append(f'{PREFIX}_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            lines += _counter("errors_total", "Error responses by OpenAI-style error code.")
            lines += [f'{PREFIX}_errors_total{{code="{c}"}} {n}' for c, n in sorted(self.errors.items())]
            lines += self._latency_lines()
            lines += _counter("audio_seconds_total", "Seconds of audio transcribed.")
            lines.append(f"{PREFIX}_audio_seconds_total {self.audio_seconds:.3f}")
            lines += [f"# HELP {PREFIX}_in_flight_requests Transcriptions in progress."]
            lines += [
                f"# TYPE {PREFIX}_in_flight_requests gauge",
                f"{PREFIX}_in_flight_requests {self.in_flight}",
            ]
        lines += _counter("batches_total", "Model calls made by the micro-batcher.")
        lines.append(f"{PREFIX}_batches_total {batches}")
        lines += _counter("batched_requests_total", "Requests carried by those calls.")
        lines.append(f"{PREFIX}_batched_requests_total {batched_items}")
        return "\n".join(lines) + "\n"

    def _latency_lines(self) -> list[str]:
        name = f"{PREFIX}_request_latency_seconds"
        lines = [f"# HELP {name} Transcription request latency.", f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, n in zip((*LATENCY_BUCKETS_S, "+Inf"), self.latency_counts, strict=True):
            cumulative += n
            lines.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
        lines += [f"{name}_sum {self.latency_sum:.6f}", f"{name}_count {cumulative}"]
        return lines


def _counter(name: str, help_text: str) -> list[str]:
    return [f"# HELP {PREFIX}_{name} {help_text}", f"# TYPE {PREFIX}_{name} counter"]
