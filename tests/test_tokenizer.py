"""Tokenizer training from a manifest (CLI) or a shard directory, on normalized transcripts."""

from __future__ import annotations

import json
import subprocess
import sys

from asr.text import normalize
from asr.tokenizer import BLANK_PIECE, Tokenizer
from data_prep.tokenizer import corpus_texts, train_from_corpus


def manifest_texts(manifest) -> list[str]:
    return [normalize(json.loads(line)["text"]) for line in manifest.read_text().splitlines()]


def test_cli_trains_on_a_manifest(speech_corpus, tmp_path):
    model = tmp_path / "tok" / "t.model"
    cmd = [sys.executable, "-m", "data_prep.tokenizer", f"input={speech_corpus['train']}", f"model={model}"]
    run = subprocess.run([*cmd, "vocab_size=40"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tok"]  # nothing else written to the cwd
    tok = Tokenizer(model)
    assert tok.blank_id == 0 and tok.id_to_piece(0) == BLANK_PIECE and tok.vocab_size <= 40
    for text in manifest_texts(speech_corpus["train"]):
        ids = tok.encode(text)
        assert 0 not in ids and tok.decode(ids) == text


def test_shard_dir_texts_are_the_normalized_transcripts(speech_corpus, tiny_shards, tmp_path):
    assert sorted(corpus_texts(tiny_shards["train"])) == sorted(manifest_texts(speech_corpus["train"]))
    tok = train_from_corpus(tiny_shards["train"], tmp_path / "s.model", vocab_size=48, model_type="bpe")
    for text in manifest_texts(speech_corpus["train"]):
        assert tok.decode(tok.encode(text)) == text


def test_manifest_texts_are_normalized_and_skip_missing(tmp_path):
    rows = [
        {"id": "a", "audio": "a.wav", "text": "Don't—STOP!"},
        {"id": "b", "audio": "b.wav"},
        {"id": "c", "audio": "c.wav", "text": "Hello,   World."},
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert list(corpus_texts(manifest)) == ["don't stop", "hello world"]
