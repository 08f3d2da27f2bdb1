"""Distributed and remote paths: a Dask cluster on 127.0.0.1, s3:// output and input through moto's server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import fsspec
import pytest

from data_prep.shard import shard_manifest
from serve.try_api import free_port

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"
BUCKET = "corpus"
OUTPUTS = ("index.json", "cmvn.json", "rejects.jsonl")


def output_bytes(out: Path) -> dict[str, bytes]:
    names = sorted(p.name for p in out.glob("*.tar")) + list(OUTPUTS)
    return {n: (out / n).read_bytes() for n in names}


@pytest.fixture(scope="module")
def reference(speech_corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref")
    shard_manifest(speech_corpus["train"], out, max_shard_utterances=5, progress=False)
    return out


def test_dask_cluster_via_cli_gives_identical_shards(speech_corpus, reference, tmp_path):
    from dask.distributed import LocalCluster

    with LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, host=LOOPBACK, dashboard_address=None
    ) as cluster:
        assert cluster.scheduler_address.startswith(f"tcp://{LOOPBACK}:")
        out = tmp_path / "dask"
        cmd = [
            sys.executable,
            "-m",
            "data_prep.shard",
            f"manifest={speech_corpus['train']}",
            f"out_dir={out}",
            "max_shard_utterances=5",
            "executor=dask",
            f"executor.address={cluster.scheduler_address}",
            "progress=false",
        ]
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["shards"] == 4
    assert output_bytes(out) == output_bytes(reference)


@pytest.fixture(scope="module")
def s3():
    """An S3 endpoint (moto server on 127.0.0.1) with a bucket; s3fs is pointed at it."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address=LOOPBACK, port=port)
    server.start()
    options = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": f"http://{LOOPBACK}:{port}"},
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setitem(fsspec.config.conf, "s3", options)
        fs = fsspec.filesystem("s3", skip_instance_cache=True, **options)
        fs.mkdir(BUCKET)
        yield fs
    server.stop()


def test_s3_output_matches_local_and_resumes(speech_corpus, reference, s3, tmp_path):
    url = f"s3://{BUCKET}/shards/train"
    summary = shard_manifest(speech_corpus["train"], url, workers=2, max_shard_utterances=5, progress=False)
    assert summary["shards"] == 4 and summary["out_dir"] == url
    local = tmp_path / "downloaded"
    local.mkdir()
    for name in output_bytes(reference):
        s3.get(f"{BUCKET}/shards/train/{name}", str(local / name))
    assert output_bytes(local) == output_bytes(reference)
    assert not [p for p in s3.ls(f"{BUCKET}/shards/train") if p.endswith(".tmp")]
    rerun = shard_manifest(speech_corpus["train"], url, max_shard_utterances=5, progress=False)
    assert rerun["shards_skipped"] == 4


def test_audio_read_from_s3(speech_corpus, reference, s3, tmp_path):
    base = speech_corpus["train"].parent
    lines = []
    for line in speech_corpus["train"].read_text().splitlines():
        row = json.loads(line)
        s3.put(str(base / row["audio"]), f"{BUCKET}/{row['audio']}")
        lines.append(json.dumps({**row, "audio": f"s3://{BUCKET}/{row['audio']}"}))
    manifest = tmp_path / "remote.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    summary = shard_manifest(manifest, out, max_shard_utterances=5, progress=False)
    assert summary["utterances"] == 16 and summary["rejects"] == 0
    index, ref_index = (json.loads((d / "index.json").read_text()) for d in (out, reference))
    assert [s["frames"] for s in index["shards"]] == [s["frames"] for s in ref_index["shards"]]
    assert (out / "cmvn.json").read_bytes() == (reference / "cmvn.json").read_bytes()
