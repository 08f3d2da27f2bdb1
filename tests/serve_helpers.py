"""Helpers shared by the serving tests: a tiny random-weight model bundle and a real uvicorn server."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import torch
import uvicorn

from asr.audio import FBANK_16K
from asr.bundle import save_bundle
from asr.model import ASRModel, ModelConfig
from asr.tokenizer import train_tokenizer
from serve.try_api import free_port

STARTUP_TIMEOUT_S = 30.0


def make_tiny_bundle(out_dir: Path, sentences_file: Path, seed: int = 0) -> Path:
    """A transformer CTC model with random weights (deterministic garbage) and a tokenizer, as a bundle."""
    texts = sentences_file.read_text(encoding="utf-8").splitlines()
    tokenizer = train_tokenizer(texts, out_dir / "tok.model", vocab_size=48)
    torch.manual_seed(seed)
    cfg = ModelConfig(
        encoder="transformer", d_model=64, num_layers=2, num_heads=2, vocab_size=tokenizer.vocab_size
    )
    return save_bundle(out_dir / "tiny.pt", ASRModel(cfg).eval(), FBANK_16K, tokenizer)


@contextlib.contextmanager
def running_server(app) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread on 127.0.0.1; yields its base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
