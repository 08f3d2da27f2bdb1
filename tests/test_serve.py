"""The HTTP API on a real uvicorn server: the openai client for every format, errors over raw HTTP, concurrency."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf
from openai import OpenAI
from serve_helpers import free_port, make_tiny_bundle, running_server

from asr.audio import featurize
from asr.bundle import load_bundle
from asr.longform import ChunkingConfig, Transcriber
from serve.app import create_app
from serve.batcher import MicroBatcher
from serve.config import ServeConfig

API_KEY_ENV = "ASR_TEST_API_KEY"
API_KEY = "secret-test-key"
URL = "/v1/audio/transcriptions"
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory, sentences_file) -> Path:
    return make_tiny_bundle(tmp_path_factory.mktemp("bundle"), sentences_file)


@pytest.fixture(scope="module")
def wavs(speech_corpus) -> list[Path]:
    manifest = speech_corpus["train"]
    rows = [json.loads(line) for line in manifest.open(encoding="utf-8")]
    return [manifest.parent / r["audio"] for r in rows]


@pytest.fixture(scope="module")
def expected(bundle_path, wavs) -> dict[Path, str]:
    """Each clip's transcript computed offline, without the server."""
    bundle = load_bundle(bundle_path)
    transcriber = Transcriber.from_bundle(bundle)
    return {w: transcriber([featurize(w, bundle.feature)])[0].text for w in wavs}


def config(bundle_path: Path, **overrides) -> ServeConfig:
    return ServeConfig(model=str(bundle_path), model_id="tiny", api_key_env=API_KEY_ENV, **overrides)


@pytest.fixture(scope="module")
def server(bundle_path):
    """The default server: no API key, small upload limit so the 413 test stays cheap."""
    os.environ.pop(API_KEY_ENV, None)
    cfg = config(bundle_path, max_upload_mb=1.0, max_audio_s=120.0, max_wait_ms=20.0)
    with running_server(create_app(cfg)) as url:
        yield url


def openai_client(url: str, key: str = "unused") -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def post(url: str, content: bytes, filename: str = "a.wav", headers=None, **form) -> httpx.Response:
    files = {"file": (filename, content, "application/octet-stream")}
    return httpx.post(url + URL, files=files, data={"model": "tiny", **form}, headers=headers, timeout=60)


def post_chunked(url: str, size: int, boundary: str = "b0undary") -> httpx.Response:
    """A multipart upload streamed with chunked transfer encoding (the server cannot know its size up front)."""
    part = 64 * 1024

    def body():
        yield f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'.encode()
        for _ in range(size // part):
            yield b"\0" * part
        yield f"\r\n--{boundary}--\r\n".encode()

    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    return httpx.post(url + URL, content=body(), headers=headers, timeout=60)


def assert_openai_error(r: httpx.Response, status: int | tuple[int, ...], code: str | None = None) -> None:
    assert r.status_code in (status if isinstance(status, tuple) else (status,)), r.text
    err = r.json()["error"]
    assert err["message"] and err["type"] and err["code"]
    if code is not None:
        assert err["code"] == code


def test_openai_client_gets_every_response_format(server, wavs, expected):
    client, wav = openai_client(server), wavs[0]
    want, duration = expected[wav], sf.info(str(wav)).duration

    def create(fmt: str):
        with open(wav, "rb") as f:
            return client.audio.transcriptions.create(model="whisper-1", file=f, response_format=fmt)

    assert create("json").text == want
    assert create("text").strip() == want
    verbose = create("verbose_json")
    assert verbose.text == want and verbose.language == "english"
    assert verbose.duration == pytest.approx(duration, abs=0.01)
    seg_text = " ".join(s.text for s in verbose.segments)
    assert seg_text.split() == want.split()
    assert all(0 <= s.start <= s.end <= duration + 1e-3 for s in verbose.segments)
    srt = create("srt")
    cues = re.findall(r"^(\d+)\n(\d\d:\d\d:\d\d,\d{3}) --> (\d\d:\d\d:\d\d,\d{3})$", srt, re.M)
    assert [int(c[0]) for c in cues] == list(range(1, len(verbose.segments) + 1))
    vtt = create("vtt")
    assert vtt.startswith("WEBVTT\n\n")
    assert len(re.findall(r"^\d\d:\d\d:\d\d\.\d{3} --> \d\d:\d\d:\d\d\.\d{3}$", vtt, re.M)) == len(
        verbose.segments
    )


def test_models_health_and_metrics(server, wavs):
    models = openai_client(server).models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert httpx.get(server + "/healthz").json()["status"] == "ok"
    assert post(server, wavs[1].read_bytes()).status_code == 200
    text = httpx.get(server + "/metrics").text
    assert re.search(
        r'^asr_requests_total\{endpoint="/v1/audio/transcriptions",status="200"\} [1-9]', text, re.M
    )
    assert float(re.search(r"^asr_audio_seconds_total (\S+)", text, re.M).group(1)) > 1.0
    assert int(re.search(r"^asr_request_latency_seconds_count (\d+)", text, re.M).group(1)) >= 1
    assert re.search(r'^asr_request_latency_seconds_bucket\{le="\+Inf"\} \d+', text, re.M)


def test_other_formats_rates_and_channels_are_accepted(server, wavs):
    audio, sr = sf.read(str(wavs[2]), dtype="float32")
    stereo_44k = np.stack([audio, audio * 0.5], axis=1)  # [N, 2]; sample rate mismatch on purpose
    for fmt, ext in (("FLAC", "flac"), ("OGG", "ogg"), ("MP3", "mp3"), ("WAV", "wav")):
        buf = io.BytesIO()
        sf.write(buf, stereo_44k, 44_100 if fmt != "MP3" else 48_000, format=fmt)
        r = post(server, buf.getvalue(), filename=f"clip.{ext}", response_format="verbose_json")
        assert r.status_code == 200, (fmt, r.text)
        rate = 44_100 if fmt != "MP3" else 48_000
        assert r.json()["duration"] == pytest.approx(len(audio) / rate, abs=0.1)


def test_bad_inputs_get_openai_errors_and_the_server_survives(server, wavs):
    rng = np.random.default_rng(0)
    assert_openai_error(post(server, rng.bytes(50_000)), (400, 415))
    assert_openai_error(post(server, b""), 400, "empty_file")
    assert_openai_error(post(server, b"hello, I am text\n" * 100, filename="notes.wav"), 415)
    truncated = wavs[0].read_bytes()[:30]  # a WAV header cut short
    assert_openai_error(post(server, truncated), (400, 415))
    tiny = io.BytesIO()
    sf.write(tiny, np.zeros(100, dtype="float32"), 16_000, format="WAV")  # shorter than one 25 ms frame
    assert_openai_error(post(server, tiny.getvalue()), 400, "invalid_audio")
    assert_openai_error(post(server, wavs[0].read_bytes(), response_format="mp4"), 400, "invalid_value")
    assert_openai_error(post(server, wavs[0].read_bytes(), temperature="7"), 400, "invalid_value")
    assert_openai_error(post(server, b"\0" * (2 * 1024 * 1024)), 413, "request_too_large")
    assert_openai_error(post_chunked(server, 2 * 1024 * 1024), 413, "request_too_large")  # no Content-Length
    r = httpx.post(server + URL, data={"model": "tiny"})  # no file at all
    assert_openai_error(r, 400)
    assert httpx.get(server + "/healthz").status_code == 200
    assert post(server, wavs[0].read_bytes()).status_code == 200
    metrics = httpx.get(server + "/metrics").text
    assert re.search(r'^asr_errors_total\{code="empty_file"\} 1$', metrics, re.M)
    assert re.search(r'^asr_errors_total\{code="request_too_large"\} 2$', metrics, re.M)


def test_audio_longer_than_the_limit_is_refused(server):
    long = io.BytesIO()
    sf.write(long, np.zeros(16_000 * 121, dtype="int16"), 16_000, format="FLAC")  # 121 s > max_audio_s=120
    assert_openai_error(post(server, long.getvalue(), filename="long.flac"), 400, "audio_too_long")


def test_sixteen_concurrent_requests_equal_sequential_ones_and_are_batched(server, wavs, expected):
    clips = [wavs[i % len(wavs)] for i in range(16)]
    before = _batch_counts(server)
    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda w: post(server, w.read_bytes()), clips))
    assert [r.status_code for r in responses] == [200] * 16
    assert [r.json()["text"] for r in responses] == [expected[w] for w in clips]
    sequential = [post(server, w.read_bytes()).json()["text"] for w in clips[:4]]
    assert sequential == [expected[w] for w in clips[:4]]
    batches, requests = (a - b for a, b in zip(_batch_counts(server), before, strict=True))
    assert requests >= 16 and batches < requests  # some model calls carried several requests


def _batch_counts(url: str) -> tuple[int, int]:
    text = httpx.get(url + "/metrics").text
    batches = int(re.search(r"^asr_batches_total (\d+)", text, re.M).group(1))
    return batches, int(re.search(r"^asr_batched_requests_total (\d+)", text, re.M).group(1))


def test_api_key_is_required_when_configured(bundle_path, wavs, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, API_KEY)
    with running_server(create_app(config(bundle_path))) as url:
        assert_openai_error(post(url, wavs[0].read_bytes()), 401, "invalid_api_key")
        wrong = {"Authorization": "Bearer nope"}
        assert_openai_error(post(url, wavs[0].read_bytes(), headers=wrong), 401, "invalid_api_key")
        assert httpx.get(url + "/v1/models").status_code == 401
        odd = {"Authorization": "Bearer cl\u00e9".encode()}  # a non-ASCII token is just a wrong key
        assert_openai_error(post(url, wavs[0].read_bytes(), headers=odd), 401, "invalid_api_key")
        good = openai_client(url, API_KEY).audio.transcriptions.create(model="x", file=wavs[0].open("rb"))
        assert isinstance(good.text, str)
        assert httpx.get(url + "/healthz").status_code == 200  # probes need no key


def test_long_audio_is_chunked_into_timed_segments(bundle_path, wavs):
    pieces = [sf.read(str(w), dtype="float32")[0] for w in wavs[:8]]
    silence = np.zeros(16_000, dtype="float32")
    audio = np.concatenate([x for p in pieces for x in (p, silence)])  # ~40 s of speech and pauses
    buf = io.BytesIO()
    sf.write(buf, audio, 16_000, format="WAV")
    cfg = config(bundle_path, chunking=ChunkingConfig(chunk_s=8.0, overlap_s=2.0, pause_s=0.5))
    with running_server(create_app(cfg)) as url:
        body = post(url, buf.getvalue(), response_format="verbose_json").json()
    assert body["duration"] == pytest.approx(len(audio) / 16_000, abs=0.01)
    starts = [s["start"] for s in body["segments"]]
    assert starts == sorted(starts) and all(s["end"] <= body["duration"] + 1e-3 for s in body["segments"])
    assert " ".join(s["text"] for s in body["segments"]).split() == body["text"].split()


def test_python_m_serve_starts_the_api(bundle_path, wavs):
    port = free_port()
    cmd = [sys.executable, "-m", "serve", f"model={bundle_path}", f"port={port}", "log_level=warning"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(url + "/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        assert post(url, wavs[0].read_bytes(), response_format="text").status_code == 200
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=20)[0].decode()
    assert proc.returncode == 0, out
    assert not list(REPO.glob("outputs")), "hydra must not litter the working directory"


def test_batcher_groups_concurrent_items_keeps_order_and_survives_failures():
    batches: list[list[int]] = []

    def square(items: list[int]) -> list[int]:
        batches.append(items)
        if -1 in items:
            raise ValueError("bad item")
        return [x * x for x in items]

    async def scenario():
        batcher = MicroBatcher(square, max_batch_size=4, max_wait_ms=2000)
        batcher.start()
        t0 = time.perf_counter()
        assert await batcher.submit(3) == 9  # alone, nothing announced: no wait for company
        lone_s = time.perf_counter() - t0

        async def announced(x: int) -> int:
            with batcher.expecting():
                await asyncio.sleep(0.01 * (x % 3))  # uploads finishing at different times
            return await batcher.submit(x)

        results = await asyncio.gather(*(announced(x) for x in range(10)))
        failed = await asyncio.gather(batcher.submit(-1), return_exceptions=True)
        after = await batcher.submit(5)
        await batcher.close()
        return lone_s, results, failed, after

    lone_s, results, failed, after = asyncio.run(scenario())
    assert lone_s < 1.0
    assert results == [x * x for x in range(10)]
    grouped = batches[1:-2]  # the 10 announced items (first: the lone 3; last: the failure and the 5)
    assert sorted(x for b in grouped for x in b) == list(range(10))
    assert max(len(b) for b in grouped) == 4 and len(grouped) <= 5
    assert isinstance(failed[0], ValueError) and after == 25
