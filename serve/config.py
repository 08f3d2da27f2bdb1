"""The server's typed config (Hydra schema of ``conf/serve/*.yaml``); the app factory takes it without Hydra."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from asr.decoding import DecodingOptions
from asr.longform import ChunkingConfig

DEFAULT_PORT = 8000
MAX_UPLOAD_MB = 25.0  # OpenAI's limit for /v1/audio/transcriptions
MAX_AUDIO_S = 3600.0
API_KEY_ENV = "ASR_API_KEY"


@dataclass
class ServeConfig:
    model: str = MISSING  # model bundle (.pt) written by training
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    model_id: str = ""  # name listed by GET /v1/models; "" = the bundle's file stem
    language: str = "english"  # reported in verbose_json when the request names none
    device: str = "cpu"
    num_threads: int = 0  # torch intra-op threads; 0 = torch's default
    max_batch_size: int = 16  # chunks per forward pass; 1 = no micro-batching
    max_wait_ms: float = 5.0  # how long the first queued request waits for others to join its batch
    max_upload_mb: float = MAX_UPLOAD_MB  # larger uploads get 413
    max_audio_s: float = MAX_AUDIO_S  # longer audio gets 400
    api_key_env: str = API_KEY_ENV  # env var holding the API key; unset or empty = no authentication
    log_level: str = "info"
    decoding: DecodingOptions = field(default_factory=DecodingOptions)
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)
