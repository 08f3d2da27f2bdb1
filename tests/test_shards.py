"""Shard writing: read-back with plain WebDataset, determinism across workers and reruns, kill -9 resume, rejects."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import webdataset as wds

from asr.audio import SPECTROGRAM_8K, featurize
from asr.text import normalize
from data_prep.manifests import ManifestError
from data_prep.shard import TooManyRejects, shard_manifest
from data_prep.shards import tar_header, tarfile_header

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = ("index.json", "cmvn.json", "rejects.jsonl")
SAMPLE_RATE = 16_000


def output_bytes(out: Path) -> dict[str, bytes]:
    """Every shard and deterministic output file of a shard dir, by name."""
    names = sorted(p.name for p in out.glob("*.tar")) + list(OUTPUTS)
    return {n: (out / n).read_bytes() for n in names}


def read_manifest_rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def reference(speech_corpus, tmp_path_factory) -> Path:
    """The train split sharded by one worker in shards of 5 utterances."""
    out = tmp_path_factory.mktemp("ref") / "train"
    shard_manifest(speech_corpus["train"], out, workers=1, max_shard_utterances=5, progress=False)
    return out


def test_shards_read_back_with_plain_webdataset(speech_corpus, reference):
    rows = {r["id"]: r for r in read_manifest_rows(speech_corpus["train"])}
    urls = sorted(str(p) for p in reference.glob("train-*.tar"))
    samples = list(wds.WebDataset(urls, shardshuffle=False))
    assert sorted(s["__key__"] for s in samples) == sorted(rows)
    for s in samples:
        row = rows[s["__key__"]]
        feats = np.load(io.BytesIO(s["feats.npy"]))
        expected, duration = featurize(speech_corpus["train"].parent / row["audio"])
        assert feats.dtype == np.float16 and feats.shape == tuple(expected.shape)
        np.testing.assert_array_equal(feats, expected.numpy().astype(np.float16))
        assert s["txt"].decode("utf-8") == normalize(row["text"])
        meta = json.loads(s["json"])
        assert meta["num_frames"] == feats.shape[0] and meta["duration"] == pytest.approx(duration)
        assert meta["speaker"] == row["speaker"] and meta["sample_rate"] == SAMPLE_RATE


def test_index_and_cmvn_describe_the_shards(reference):
    index = json.loads((reference / "index.json").read_text())
    assert [s["name"] for s in index["shards"]] == [f"train-{i:06d}.tar" for i in range(4)]
    assert [s["utterances"] for s in index["shards"]] == [5, 5, 5, 1]
    frames, sums = 0, np.zeros(80)
    for shard in index["shards"]:
        data = (reference / shard["name"]).read_bytes()
        assert shard["bytes"] == len(data) and shard["sha256"] == hashlib.sha256(data).hexdigest()
        for s in wds.WebDataset(str(reference / shard["name"]), shardshuffle=False):
            feats = np.load(io.BytesIO(s["feats.npy"])).astype(np.float64)
            frames += feats.shape[0]
            sums += feats.sum(axis=0)
    cmvn = json.loads((reference / "cmvn.json").read_text())
    assert index["frames"] == frames == cmvn["count"]
    np.testing.assert_allclose(cmvn["sum"], sums, rtol=1e-9)
    assert np.all(np.array(cmvn["sum_sq"]) / frames >= np.square(sums / frames) - 1e-6)  # variance >= 0
    assert index["utterances"] == 16 and index["format_version"] == 1
    summary = json.loads((reference / "summary.json").read_text())
    assert summary["utterances"] == 16 and summary["rejects"] == 0 and summary["shards"] == 4


def test_two_workers_and_rerun_are_byte_identical(speech_corpus, reference, tmp_path):
    out = tmp_path / "train"
    first = shard_manifest(speech_corpus["train"], out, workers=2, max_shard_utterances=5, progress=False)
    assert first["shards_skipped"] == 0
    assert output_bytes(out) == output_bytes(reference)
    rerun = shard_manifest(speech_corpus["train"], out, workers=2, max_shard_utterances=5, progress=False)
    assert rerun["shards_skipped"] == 4 and rerun["hours_written"] == 0.0
    assert output_bytes(out) == output_bytes(reference)


def test_byte_bound_splits_shards(speech_corpus, tmp_path):
    # ~3 s utterances are ~50-60 kB of fp16 features: a 120 kB bound holds two of them.
    summary = shard_manifest(speech_corpus["train"], tmp_path, max_shard_bytes=120_000, progress=False)
    index = json.loads((tmp_path / "index.json").read_text())
    assert summary["shards"] == len(index["shards"]) > 4
    assert all(1 <= s["utterances"] <= 2 for s in index["shards"])


def test_telephony_spectrogram_shards_have_81_bins(speech_corpus, tmp_path):
    shard_manifest(speech_corpus["dev"], tmp_path, split="dev", feature=SPECTROGRAM_8K, progress=False)
    samples = list(wds.WebDataset(str(tmp_path / "dev-000000.tar"), shardshuffle=False))
    assert len(samples) == 4
    assert all(np.load(io.BytesIO(s["feats.npy"])).shape[1] == 81 for s in samples)
    assert json.loads((tmp_path / "index.json").read_text())["feature"]["kind"] == "spectrogram"


def _bigger_manifest(speech_corpus, tmp_path: Path, copies: int) -> Path:
    """The train split repeated under new ids: enough work to kill a run in the middle of it."""
    base = speech_corpus["train"].parent
    rows = read_manifest_rows(speech_corpus["train"])
    lines = [
        json.dumps({**r, "id": f"{r['id']}-{c}", "audio": str(base / r["audio"])})
        for c in range(copies)
        for r in rows
    ]
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_killed_run_resumes_to_identical_output(speech_corpus, tmp_path):
    manifest = _bigger_manifest(speech_corpus, tmp_path, copies=8)  # 128 utterances, 32 shards
    args = [f"manifest={manifest}", "max_shard_utterances=4", "progress=false"]
    shard_manifest(manifest, tmp_path / "ref", max_shard_utterances=4, progress=False)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "data_prep.shard", f"out_dir={killed}", *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while len(list(killed.glob("*.tar"))) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done_before = len(list(killed.glob("*.tar")))
    assert 3 <= done_before < 32, "the run must be killed mid-way"
    summary = shard_manifest(manifest, killed, max_shard_utterances=4, progress=False)
    assert summary["shards_skipped"] >= done_before - 1  # a tar renamed just before its sidecar is redone
    assert summary["utterances"] == 128
    assert output_bytes(killed) == output_bytes(tmp_path / "ref")
    assert not list(killed.glob(".*.tmp"))


def _write_wav(path: Path, seconds: float, sr: int = SAMPLE_RATE) -> None:
    t = np.arange(int(seconds * sr)) / sr
    sf.write(path, 0.3 * np.sin(2 * np.pi * 300 * t), sr, subtype="PCM_16")


def _bad_corpus(speech_corpus, d: Path) -> tuple[Path, dict[str, str]]:
    """A manifest with one good utterance per bad one; returns (manifest, {id: expected reason})."""
    good = [
        {"id": r["id"], "audio": str(speech_corpus["train"].parent / r["audio"]), "text": r["text"]}
        for r in read_manifest_rows(speech_corpus["train"])
    ]
    (d / "noise.wav").write_bytes(os.urandom(4000))
    (d / "notes.wav").write_text("this is not audio at all\n")
    sf.write(d / "empty.wav", np.zeros(0), SAMPLE_RATE, subtype="PCM_16")
    _write_wav(d / "full.wav", 2.0)
    (d / "truncated.wav").write_bytes((d / "full.wav").read_bytes()[:30])  # header cut mid-way
    (d / "cut.wav").write_bytes((d / "full.wav").read_bytes()[:20_000])  # data cut mid-way: 0.6 of 2 s
    wav, _ = sf.read(d / "full.wav")
    sf.write(d / "full.mp3", wav, SAMPLE_RATE, format="MP3")
    mp3 = (d / "full.mp3").read_bytes()
    (d / "cut.mp3").write_bytes(mp3[: len(mp3) // 2])
    _write_wav(d / "blip.wav", 0.05)
    _write_wav(d / "long.wav", 6.0)
    bad = {
        "b-noise": ("noise.wav", "random bytes", "unreadable_audio"),
        "b-notes": ("notes.wav", "a text file", "unreadable_audio"),
        "b-empty": ("empty.wav", "no samples", "empty_audio"),
        "b-trunc": ("truncated.wav", "cut short", "unreadable_audio"),
        "b-cutwav": ("cut.wav", "cut mid data", "truncated_audio"),
        "b-cutmp3": ("cut.mp3", "cut mid stream", "truncated_audio"),
        "b-mp3": ("full.mp3", "a whole mp3 is fine", None),
        "b-missing": ("nowhere.wav", "no such file", "missing_audio"),
        "b-short": ("blip.wav", "too short", "too_short"),
        "b-long": ("long.wav", "too long", "too_long"),
        "b-notext": ("full.wav", None, "missing_transcript"),
        "b-blank": ("full.wav", "?!", "empty_transcript"),
    }
    lines = [json.dumps(g).encode() for g in good]
    for uid, (wav, text, _) in bad.items():
        lines.append(json.dumps({"id": uid, "audio": wav, "text": text}).encode())
    segment = {"id": "b-segment", "audio": "full.wav", "text": "past the end", "start": 1.0, "end": 4.0}
    lines.append(json.dumps(segment).encode())  # the 2 s file ends before the segment does
    lines.append(b'{"id": "b-latin1", "audio": "full.wav", "text": "caf\xe9 au lait"}')  # not UTF-8
    lines.append(json.dumps({"id": good[0]["id"], "audio": "full.wav", "text": "again"}).encode())
    manifest = d / "bad.jsonl"
    manifest.write_bytes(b"\n".join(lines) + b"\n")
    expected = {uid: reason for uid, (_, _, reason) in bad.items() if reason}
    expected |= {
        "b-segment": "truncated_audio",
        "b-latin1": "transcript_not_utf8",
        good[0]["id"]: "duplicate_id",
    }
    return manifest, expected


def test_each_kind_of_bad_input_is_rejected_with_its_reason(speech_corpus, tmp_path):
    manifest, expected = _bad_corpus(speech_corpus, tmp_path)
    out = tmp_path / "out"
    summary = shard_manifest(manifest, out, max_duration=5.0, max_reject_fraction=0.5, progress=False)
    rejects = [json.loads(line) for line in (out / "rejects.jsonl").read_text().splitlines()]
    assert {r["id"]: r["reason"] for r in rejects} == expected
    assert len(rejects) == len(expected) == summary["rejects"]
    assert summary["utterances"] == 17  # every good utterance is kept exactly once
    keys = [s["__key__"] for s in wds.WebDataset(str(out / "train-000000.tar"), shardshuffle=False)]
    assert len(keys) == len(set(keys)) == 17 and [k for k in keys if k.startswith("b-")] == ["b-mp3"]


def test_too_many_rejects_fails_naming_the_worst_reasons(speech_corpus, tmp_path):
    manifest, _ = _bad_corpus(speech_corpus, tmp_path)
    with pytest.raises(TooManyRejects, match=r"14 of 31 .*truncated_audio \(3\), unreadable_audio \(3\)"):
        shard_manifest(manifest, tmp_path / "out", max_duration=5.0, max_reject_fraction=0.2, progress=False)
    assert len((tmp_path / "out" / "rejects.jsonl").read_text().splitlines()) == 14
    assert not (tmp_path / "out" / "index.json").exists()  # the split is not marked usable
    summary = shard_manifest(
        manifest, tmp_path / "out", max_duration=5.0, max_reject_fraction=0.5, progress=False
    )
    assert summary["shards_skipped"] == 1 and (tmp_path / "out" / "index.json").exists()


def test_malformed_manifest_line_fails_with_file_and_line(speech_corpus, tmp_path):
    rows = read_manifest_rows(speech_corpus["dev"])
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(json.dumps(rows[0]) + "\n" + json.dumps(rows[1]) + "\n{not json\n")
    with pytest.raises(ManifestError, match=rf"{manifest}:3: not valid JSON"):
        shard_manifest(manifest, tmp_path / "out", progress=False)
    manifest.write_text(json.dumps({"audio": "x.wav", "text": "no id"}) + "\n")
    with pytest.raises(ManifestError, match=rf"{manifest}:1: field 'id'"):
        shard_manifest(manifest, tmp_path / "out", progress=False)


def test_cli_writes_shards_without_littering_the_cwd(speech_corpus, tmp_path):
    out = tmp_path / "cli"
    cmd = [sys.executable, "-m", "data_prep.shard", f"manifest={speech_corpus['test']}", f"out_dir={out}"]
    run = subprocess.run([*cmd, "split=test", "progress=false"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["utterances"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli"]
    assert (out / "test-000000.tar").exists()
    typo = subprocess.run([*cmd, "max_shard_utterance=3"], cwd=tmp_path, capture_output=True, text=True)
    assert typo.returncode != 0 and "max_shard_utterance" in typo.stderr


def test_long_and_unsafe_ids_become_readable_keys(speech_corpus, tmp_path):
    rows = read_manifest_rows(speech_corpus["dev"])[:2]
    ids = ["spk1/chapter.7/" + "x" * 150, "café.utt 2"]  # longer than a ustar name; "." and "/" split keys
    lines = [
        json.dumps({**r, "id": i, "audio": str(speech_corpus["dev"].parent / r["audio"])})
        for r, i in zip(rows, ids, strict=True)
    ]
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    shard_manifest(tmp_path / "m.jsonl", tmp_path / "out", progress=False)
    samples = list(wds.WebDataset(str(tmp_path / "out" / "train-000000.tar"), shardshuffle=False))
    assert sorted(s["__key__"] for s in samples) == sorted(["spk1_chapter_7_" + "x" * 150, "café_utt_2"])
    assert sorted(json.loads(s["json"])["id"] for s in samples) == sorted(ids)  # traceable to the corpus


@pytest.mark.parametrize(
    "name,size",
    [
        ("a.txt", 0),
        ("train-000001.feats.npy", 57_728),
        ("x" * 99, 8**11 - 1),
        ("x" * 100, 5),
        ("café.txt", 9),
    ],
)
def test_fast_tar_header_is_the_one_tarfile_writes(name, size):
    assert tar_header(name, size) == tarfile_header(name, size)
