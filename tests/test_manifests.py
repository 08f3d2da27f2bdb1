"""Corpus adapters on tiny corpora laid out like JSONL, LibriSpeech, Kaldi and Common Voice, then sharded."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import webdataset as wds

from asr.audio import featurize
from asr.text import normalize
from data_prep.manifests import ManifestError, detect_format, read_manifest
from data_prep.shard import shard_manifest


@pytest.fixture(scope="module")
def clips(speech_corpus) -> list[tuple[np.ndarray, int, str]]:
    """Four (waveform, sample rate, transcript) from the espeak corpus."""
    rows = [json.loads(x) for x in speech_corpus["dev"].read_text().splitlines()]
    out = []
    for r in rows:
        data, sr = sf.read(speech_corpus["dev"].parent / r["audio"], dtype="float32")
        out.append((data, sr, r["text"]))
    return out


def shard_samples(manifest: Path, out: Path, **kwargs) -> dict[str, dict]:
    """Shard a corpus and read it back: {key: sample}."""
    summary = shard_manifest(manifest, out, progress=False, **kwargs)
    assert summary["rejects"] == 0
    urls = sorted(str(p) for p in out.glob("*.tar"))
    return {s["__key__"]: s for s in wds.WebDataset(urls, shardshuffle=False)}


def test_jsonl_resolves_relative_audio_and_keeps_optional_fields(tmp_path, clips):
    (tmp_path / "audio").mkdir()
    sf.write(tmp_path / "audio" / "a.wav", clips[0][0], clips[0][1])
    line = {"id": "a", "audio": "audio/a.wav", "text": "Hi", "start": 0.5, "end": 1.5, "speaker": "s1"}
    (tmp_path / "m.jsonl").write_text(json.dumps(line) + "\n\n")
    [rec] = list(read_manifest(tmp_path / "m.jsonl"))
    assert rec == {**line, "audio": str(tmp_path / "audio" / "a.wav")}
    (tmp_path / "bad.jsonl").write_text(json.dumps({**line, "start": "soon"}) + "\n")
    with pytest.raises(ManifestError, match=r"bad.jsonl:1: field 'start'"):
        list(read_manifest(tmp_path / "bad.jsonl"))


def test_librispeech_layout(tmp_path, clips):
    for i, (wav, sr, text) in enumerate(clips):
        spk, chapter = ("19", "198") if i < 2 else ("26", "495")
        d = tmp_path / spk / chapter
        d.mkdir(parents=True, exist_ok=True)
        utt = f"{spk}-{chapter}-{i:04d}"
        sf.write(d / f"{utt}.flac", wav, sr)
        with (d / f"{spk}-{chapter}.trans.txt").open("a") as f:
            f.write(f"{utt} {text.upper()}\n")
    assert detect_format(tmp_path) == "librispeech"
    records = list(read_manifest(tmp_path))
    assert [r["speaker"] for r in records] == ["19", "19", "26", "26"]
    samples = shard_samples(tmp_path, tmp_path / "out")
    assert len(samples) == 4
    for r in records:
        s = samples[r["id"]]
        assert s["txt"].decode() == normalize(r["text"]) and json.loads(s["json"])["speaker"] == r["speaker"]


def _long_recording(clips) -> tuple[np.ndarray, int, list[tuple[float, float, str]]]:
    """The clips joined with 0.5 s of silence; returns (wav, sr, [(start, end, text)])."""
    sr = clips[0][1]
    gap = np.zeros(sr // 2, np.float32)
    parts, segs, t = [], [], 0.0
    for wav, _, text in clips:
        parts += [wav, gap]
        segs.append((round(t, 3), round(t + len(wav) / sr, 3), text))
        t += (len(wav) + len(gap)) / sr
    return np.concatenate(parts), sr, segs


def test_kaldi_data_dir_with_segments(tmp_path, clips):
    wav, sr, segs = _long_recording(clips)
    sf.write(tmp_path / "rec1.wav", wav, sr, subtype="PCM_16")
    d = tmp_path / "data"
    d.mkdir()
    (d / "wav.scp").write_text("rec1 ../rec1.wav\n")
    ids = [f"spk1-rec1-{i}" for i in range(len(segs))]
    (d / "segments").write_text(
        "".join(f"{u} rec1 {s} {e}\n" for u, (s, e, _) in zip(ids, segs, strict=True))
    )
    (d / "text").write_text("".join(f"{u} {t}\n" for u, (_, _, t) in zip(ids, segs, strict=True)))
    (d / "utt2spk").write_text("".join(f"{u} spk1\n" for u in ids))
    assert detect_format(d) == "kaldi"
    samples = shard_samples(d, tmp_path / "out")
    assert sorted(samples) == sorted(ids)
    for u, (start, end, text) in zip(ids, segs, strict=True):
        s = samples[u]
        meta = json.loads(s["json"])
        assert meta["duration"] == pytest.approx(end - start, abs=1e-3)
        assert (meta["start"], meta["end"], meta["speaker"]) == (start, end, "spk1")
        expected, _ = featurize(tmp_path / "rec1.wav", start=start, end=end)
        np.testing.assert_array_equal(
            np.load(io.BytesIO(s["feats.npy"])), expected.numpy().astype(np.float16)
        )
        assert s["txt"].decode() == normalize(text)


def test_kaldi_data_dir_without_segments(tmp_path, clips):
    for i, (wav, sr, _) in enumerate(clips[:2]):
        sf.write(tmp_path / f"u{i}.wav", wav, sr)
    (tmp_path / "wav.scp").write_text(f"u0 {tmp_path / 'u0.wav'}\nu1 u1.wav\n")
    (tmp_path / "text").write_text(f"u0 {clips[0][2]}\n")  # u1 has no transcript
    records = list(read_manifest(tmp_path))
    assert [(r["id"], r["text"]) for r in records] == [("u0", clips[0][2]), ("u1", None)]
    assert records[1]["audio"] == str(tmp_path / "u1.wav")
    (tmp_path / "wav.scp").write_text("u0 sox u0.wav -t wav - |\n")
    with pytest.raises(ManifestError, match="only plain paths"):
        list(read_manifest(tmp_path))


def test_common_voice_tsv_with_mp3_clips(tmp_path, clips):
    (tmp_path / "clips").mkdir()
    header = "client_id\tpath\tsentence\tup_votes\tdown_votes\tage\tgender\taccent\n"
    rows = []
    for i, (wav, sr, text) in enumerate(clips):
        name = f"common_voice_en_{1000 + i}.mp3"
        sf.write(tmp_path / "clips" / name, wav, sr, format="MP3")
        rows.append(f"client{i % 2}\t{name}\t{text}\t2\t0\t\t\t\n")
    (tmp_path / "train.tsv").write_text(header + "".join(rows))
    assert detect_format(tmp_path / "train.tsv") == "commonvoice"
    samples = shard_samples(tmp_path / "train.tsv", tmp_path / "out")
    assert sorted(samples) == [f"common_voice_en_{1000 + i}" for i in range(4)]
    for i, (wav, sr, text) in enumerate(clips):
        s = samples[f"common_voice_en_{1000 + i}"]
        meta = json.loads(s["json"])
        assert meta["speaker"] == f"client{i % 2}" and s["txt"].decode() == normalize(text)
        assert meta["duration"] == pytest.approx(len(wav) / sr, abs=0.1)  # mp3 adds encoder padding
    (tmp_path / "short.tsv").write_text(header + "client0\tx.mp3\n")
    with pytest.raises(ManifestError, match=r"short.tsv:2: wrong number of columns"):
        list(read_manifest(tmp_path / "short.tsv"))
