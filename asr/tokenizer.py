"""SentencePiece wrapper with the CTC blank at id 0, and tokenizer training from a text stream."""

from __future__ import annotations

import io
from collections.abc import Iterable
from os import PathLike
from pathlib import Path

import sentencepiece as spm

BLANK_ID = 0  # CTC blank; sentencepiece's pad piece, never produced by encode()
BLANK_PIECE = "<blk>"
UNK_ID = 1


class Tokenizer:
    """Text <-> token ids. Built from a ``.model`` file or its serialized bytes (as stored in a model bundle)."""

    def __init__(self, model: str | PathLike | bytes):
        proto = model if isinstance(model, bytes) else Path(model).read_bytes()
        self._sp = spm.SentencePieceProcessor(model_proto=proto)
        if self._sp.piece_to_id(BLANK_PIECE) != BLANK_ID:
            raise ValueError(
                f"tokenizer model must have {BLANK_PIECE!r} at id {BLANK_ID}; train it with train_tokenizer()"
            )
        self.proto = proto

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def blank_id(self) -> int:
        return BLANK_ID

    def encode(self, text: str) -> list[int]:
        return self._sp.encode(text, out_type=int)

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.decode([i for i in ids if i != BLANK_ID])

    def id_to_piece(self, i: int) -> str:
        return self._sp.id_to_piece(i)


def train_tokenizer(
    texts: Iterable[str],
    model_path: str | PathLike,
    vocab_size: int = 256,
    model_type: str = "unigram",
    character_coverage: float = 1.0,
    max_sentences: int = 2_000_000,
) -> Tokenizer:
    """Train sentencepiece on a stream of (already normalized) transcripts; writes ``model_path`` (.model).

    ``vocab_size`` counts the blank and <unk>. It is a soft limit: a small corpus yields fewer pieces
    rather than an error. Input is streamed; at most ``max_sentences`` are sampled.
    """
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=(t for t in texts if t),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        input_sentence_size=max_sentences,
        shuffle_input_sentence=True,
        hard_vocab_limit=False,
        pad_id=BLANK_ID,
        pad_piece=BLANK_PIECE,
        unk_id=UNK_ID,
        bos_id=-1,
        eos_id=-1,
        num_threads=1,  # NOTE: deterministic output for the same input
        minloglevel=2,
    )
    path = Path(model_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)
    return Tokenizer(path)
