"""CTC decoding strategies behind one small interface: greedy best path, and beam search with an optional LM.

``build_decoder(options, tokenizer)`` returns a ``Decoder``; ``decoder.decode(log_probs [B, T, V], lengths [B])``
returns one ``DecodingResult`` per utterance, with the output frame of every token (for segment times).

NOTE: beam search uses torchaudio's flashlight-text CTC decoder rather than pyctcdecode: it is C++ (fast enough
to serve on one core), takes KenLM ARPA or binary word n-gram models directly, and returns token time steps.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from asr.tokenizer import Tokenizer

STRATEGIES = ("greedy", "beam")
SIL_PIECE = (
    "<sil>"  # NOTE: flashlight needs a silence token; sentencepiece has none, so a dummy class is appended
)
NEG_INF = -1e30  # log-probability of the dummy silence class
UNK_WORD = "<unk>"
ARPA_SPECIAL_WORDS = ("<s>", "</s>", "<unk>")


def greedy_ctc(log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int = 0) -> list[list[int]]:
    """Best path: argmax per frame, collapse repeats, drop blanks.

    log_probs: [B, T, V] (log-)probabilities or logits; lengths: [B] valid frames. Returns token ids per utterance.
    """
    return [list(r[0]) for r in _greedy_paths(log_probs, lengths, blank_id)]


@dataclass(frozen=True)
class DecodingOptions:
    """How to turn CTC log-probabilities into text (also the Hydra schema of ``conf/decoding/*.yaml``)."""

    strategy: str = "greedy"  # "greedy" (best path) or "beam" (CTC prefix beam search)
    beam_size: int = 8  # hypotheses kept per frame (beam only)
    beam_size_token: int | None = None  # tokens tried per frame; None = the whole vocabulary
    beam_threshold: float = 50.0  # prune hypotheses scoring this far below the best
    lm: str | None = None  # KenLM word n-gram file (ARPA or binary); None = no language model
    lexicon: str | None = (
        None  # "word<TAB>piece piece ..." lines; None with an ARPA lm = built from its unigrams
    )
    lm_weight: float = 0.5  # weight of the LM log-probability
    word_score: float = 0.0  # bonus per emitted word (counters the LM's bias to short outputs)
    unk_score: float = -math.inf  # score of words outside the lexicon (-inf: never emitted)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"decoding strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {self.beam_size}")


@dataclass(frozen=True)
class DecodingResult:
    """One decoded utterance."""

    text: str  # detokenized transcript
    tokens: tuple[int, ...]  # token ids, blanks removed
    frames: tuple[int, ...]  # output frame at which each token is emitted (same length as tokens)
    score: float  # log-score of the hypothesis (greedy: sum of best-path frame log-probs)


class Decoder(Protocol):
    def decode(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[DecodingResult]:
        """log_probs [B, T, V] (log-softmax output), lengths [B] -> one result per utterance."""
        ...


def build_decoder(options: DecodingOptions, tokenizer: Tokenizer) -> Decoder:
    """The decoder ``options.strategy`` names, for ``tokenizer``'s vocabulary."""
    if options.strategy == "greedy":
        return GreedyDecoder(tokenizer)
    return BeamSearchDecoder(options, tokenizer)


def _greedy_paths(
    log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int
) -> list[tuple[list[int], list[int], float]]:
    """[B, T, V], [B] -> per utterance (token ids, their frames, best-path score)."""
    best_lp, best = log_probs.detach().float().cpu().max(dim=-1)  # [B, T], [B, T]
    prev = torch.nn.functional.pad(best, (1, 0), value=blank_id)[:, :-1]  # [B, T] previous frame's label
    emit = (best != blank_id) & (best != prev)  # [B, T] first frame of each non-blank run
    out = []
    for b, n in enumerate(lengths.tolist()):
        frames = emit[b, :n].nonzero().squeeze(1)  # [K]
        out.append((best[b, frames].tolist(), frames.tolist(), float(best_lp[b, :n].sum())))
    return out


class GreedyDecoder:
    """Best path decoding: argmax per frame, collapse repeats, drop blanks."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def decode(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[DecodingResult]:
        """log_probs [B, T, V], lengths [B] -> one result per utterance."""
        return [
            DecodingResult(self.tokenizer.decode(ids), tuple(ids), tuple(frames), score)
            for ids, frames, score in _greedy_paths(log_probs, lengths, self.tokenizer.blank_id)
        ]


class BeamSearchDecoder:
    """CTC beam search (flashlight-text via torchaudio), lexicon-free, or lexicon-constrained with a KenLM."""

    def __init__(self, options: DecodingOptions, tokenizer: Tokenizer):
        from torchaudio.models.decoder import ctc_decoder  # NOTE: lazy: needs flashlight-text

        self.tokenizer = tokenizer
        self.vocab_size = tokenizer.vocab_size
        tokens = [tokenizer.id_to_piece(i) for i in range(self.vocab_size)] + [SIL_PIECE]
        with tempfile.TemporaryDirectory(prefix="lexicon-") as tmp:  # NOTE: read once, at construction
            self._decoder = ctc_decoder(
                lexicon=_lexicon_path(options, tokenizer, Path(tmp)),
                tokens=tokens,
                lm=options.lm,
                nbest=1,
                beam_size=options.beam_size,
                beam_size_token=options.beam_size_token,
                beam_threshold=options.beam_threshold,
                lm_weight=options.lm_weight,
                word_score=options.word_score,
                unk_score=options.unk_score,
                sil_score=0.0,
                log_add=False,
                blank_token=tokens[tokenizer.blank_id],
                sil_token=SIL_PIECE,
                unk_word=UNK_WORD,
            )

    def decode(self, log_probs: torch.Tensor, lengths: torch.Tensor) -> list[DecodingResult]:
        """log_probs [B, T, V], lengths [B] -> one result per utterance."""
        lp = log_probs.detach().float().cpu()  # [B, T, V]
        sil = torch.full((*lp.shape[:2], 1), NEG_INF)  # [B, T, 1] the never-emitted dummy silence class
        emissions = torch.cat([lp, sil], dim=-1).contiguous()  # [B, T, V + 1]
        hyps = self._decoder(emissions, lengths.to(torch.int32).cpu())
        return [self._result(h[0]) if h else DecodingResult("", (), (), NEG_INF) for h in hyps]

    def _result(self, hyp) -> DecodingResult:
        keep = [
            (t, f)
            for t, f in zip(hyp.tokens.tolist(), hyp.timesteps.tolist(), strict=True)
            if t < self.vocab_size and t != self.tokenizer.blank_id
        ]
        ids = tuple(t for t, _ in keep)
        return DecodingResult(self.tokenizer.decode(ids), ids, tuple(f for _, f in keep), float(hyp.score))


def _lexicon_path(options: DecodingOptions, tokenizer: Tokenizer, tmp_dir: Path) -> str | None:
    """The lexicon file to use: the user's, one built from an ARPA LM's words, or None (lexicon-free)."""
    if options.lm is None or options.lexicon is not None:
        return options.lexicon
    if not _is_arpa(options.lm):
        raise ValueError("a binary KenLM model needs decoding.lexicon (word -> pieces); ARPA models do not")
    path = tmp_dir / "lexicon.txt"
    write_lexicon(arpa_words(options.lm), tokenizer, path)
    return str(path)


def _is_arpa(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(64).lstrip().startswith(b"\\data\\")


def arpa_words(path: str | Path) -> list[str]:
    """The unigram vocabulary of an ARPA n-gram file, special words (<s>, </s>, <unk>) excluded."""
    words, in_unigrams = [], False
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line.startswith("\\"):
                in_unigrams = line == "\\1-grams:"
                continue
            parts = line.split()
            if in_unigrams and len(parts) >= 2 and parts[1] not in ARPA_SPECIAL_WORDS:
                words.append(parts[1])
    return words


def write_lexicon(words: list[str], tokenizer: Tokenizer, path: Path) -> int:
    """Write "word<TAB>pieces" lines spelling each word with the tokenizer; returns words written.

    Words the tokenizer can only spell with <unk> are left out (the decoder could never emit them).
    """
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for word in words:
            ids = tokenizer.encode(word)
            if (
                ids
                and tokenizer.blank_id not in ids
                and all(tokenizer.id_to_piece(i) != UNK_WORD for i in ids)
            ):
                f.write(f"{word}\t{' '.join(tokenizer.id_to_piece(i) for i in ids)}\n")
                n += 1
    if n == 0:
        raise ValueError("no word of the language model can be spelled with the tokenizer's pieces")
    return n
