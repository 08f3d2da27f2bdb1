"""Train the sentencepiece tokenizer on normalized transcripts: ``python -m data_prep.tokenizer``.

    python -m data_prep.tokenizer input=data/train.jsonl model=runs/demo/tokenizer.model vocab_size=256
    python -m data_prep.tokenizer input=shards/train model=tok.model     # a shard dir: reads its KEY.txt

The input is a manifest in any layout ``data_prep.manifests`` reads, or a shard directory (with index.json).
Transcripts are streamed and normalized with ``asr.text.normalize`` (shard texts already are).
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from asr.text import normalize
from asr.tokenizer import Tokenizer, train_tokenizer
from data_prep import storage
from data_prep.manifests import read_manifest

TEXT_SUFFIX = ".txt"
INDEX = "index.json"


def shard_texts(shard_dir: str | Path) -> Iterator[str]:
    """Transcripts stored in a shard directory, shard by shard in index order."""
    index = json.loads(storage.read_bytes(storage.join(str(shard_dir), INDEX)))
    for shard in index["shards"]:
        with storage.open_input_stream(storage.join(str(shard_dir), shard["name"])) as f:
            with tarfile.open(fileobj=f, mode="r|") as tar:
                for member in tar:
                    if member.name.endswith(TEXT_SUFFIX):
                        yield tar.extractfile(member).read().decode("utf-8")


def manifest_texts(manifest: str | Path, fmt: str = "auto") -> Iterator[str]:
    """Normalized transcripts of a manifest; utterances without a usable transcript are skipped."""
    for record in read_manifest(manifest, fmt):
        text = record.get("text")
        if not isinstance(text, str):
            continue
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            continue  # the shard writer rejects these too
        yield normalize(text)


def corpus_texts(source: str | Path, fmt: str = "auto") -> Iterator[str]:
    """Texts of a shard directory (has index.json) or a manifest."""
    if storage.exists(storage.join(str(source), INDEX)):
        return shard_texts(source)
    return manifest_texts(source, fmt)


def train_from_corpus(
    source: str | Path,
    model: str | Path,
    vocab_size: int = 256,
    model_type: str = "unigram",
    fmt: str = "auto",
) -> Tokenizer:
    """Train a tokenizer on the normalized transcripts of ``source``; writes ``model`` (.model)."""
    return train_tokenizer(corpus_texts(source, fmt), model, vocab_size=vocab_size, model_type=model_type)


@dataclass
class TokenizerJobConfig:
    input: str = MISSING  # manifest (JSONL, LibriSpeech dir, Kaldi dir, Common Voice .tsv) or shard dir
    model: str = MISSING  # output .model path
    vocab_size: int = 256
    model_type: str = "unigram"  # unigram | bpe | char | word
    manifest_format: str = "auto"


@hydra.main(version_base=None, config_path="../conf/prep", config_name="tokenizer")
def main(cfg: TokenizerJobConfig) -> None:
    tok = train_from_corpus(cfg.input, cfg.model, cfg.vocab_size, cfg.model_type, cfg.manifest_format)
    print(f"wrote {cfg.model}: {tok.vocab_size} pieces ({cfg.model_type})")


if __name__ == "__main__":
    ConfigStore.instance().store(name="tokenizer_schema", node=TokenizerJobConfig)
    main()
