"""Start the API on a free local port, transcribe a few manifest clips over HTTP, print them, stop the server.

    python -m serve.try_api model=runs/demo/train/bundle.pt manifest=runs/demo/corpus/test.jsonl clips=2

This is the last step of ``make demo``: it calls ``POST /v1/audio/transcriptions`` exactly as a client would.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

STARTUP_TIMEOUT_S = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def multipart(fields: dict[str, str], file_name: str, file_bytes: bytes) -> tuple[bytes, str]:
    """A multipart/form-data body with text fields and one ``file`` part; returns (body, content type)."""
    boundary = uuid.uuid4().hex
    parts = [
        f'--{boundary}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'.encode()
        for k, v in fields.items()
    ]
    head = f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{file_name}"\r\n'
    parts.append(head.encode() + b"Content-Type: application/octet-stream\r\n\r\n" + file_bytes + b"\r\n")
    return b"".join(parts) + f"--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def transcribe(base_url: str, audio: Path, model: str = "asr") -> dict:
    """POST one file to /v1/audio/transcriptions (verbose_json); returns the parsed response."""
    body, ctype = multipart(
        {"model": model, "response_format": "verbose_json"}, audio.name, audio.read_bytes()
    )
    req = urllib.request.Request(f"{base_url}/v1/audio/transcriptions", body, {"Content-Type": ctype})
    with urllib.request.urlopen(req, timeout=120) as resp:
        return json.load(resp)


def wait_healthy(base_url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base_url}/healthz", timeout=2):
                return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"server not healthy after {STARTUP_TIMEOUT_S:.0f} s")


def main(argv: list[str]) -> int:
    args = dict(a.split("=", 1) for a in argv)
    unknown = set(args) - {"model", "manifest", "clips"}
    if unknown or not {"model", "manifest"} <= set(args):
        print(__doc__, file=sys.stderr)
        return 2
    manifest = Path(args["manifest"])
    rows = [json.loads(line) for line in manifest.open(encoding="utf-8")][: int(args.get("clips", 2))]
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "serve", f"model={args['model']}", f"port={port}", "log_level=warning"]
    proc = subprocess.Popen(cmd)
    try:
        wait_healthy(base_url, proc)
        print(f"API up at {base_url}; POST /v1/audio/transcriptions:")
        for row in rows:
            t0 = time.perf_counter()
            out = transcribe(base_url, manifest.parent / row["audio"])
            ms = (time.perf_counter() - t0) * 1000
            print(
                f"  {row['id']} ({out['duration']:.1f} s audio, {ms:.0f} ms)\n    REF: {row['text']}\n    HYP: {out['text']}"
            )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print("API stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
