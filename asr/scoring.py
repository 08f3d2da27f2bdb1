"""Word and character error rates (jiwer) on text normalized by asr.text.normalize."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import jiwer

from asr.text import normalize


@dataclass(frozen=True)
class ErrorRates:
    wer: float  # (S + D + I) / reference words
    cer: float  # character edits / reference characters (spaces included)
    substitutions: int  # word level
    deletions: int
    insertions: int
    ref_words: int  # the WER denominator
    hyp_words: int
    char_errors: int
    ref_chars: int
    utterances: int

    def to_dict(self) -> dict:
        return asdict(self)


def word_edits(ref: str, hyp: str) -> tuple[int, int, int]:
    """(substitutions, deletions, insertions) of the minimal word alignment of two normalized strings."""
    if not ref or not hyp:  # NOTE: jiwer rejects empty strings; the alignment is trivial then
        return 0, len(ref.split()), len(hyp.split())
    out = jiwer.process_words(ref, hyp)
    return out.substitutions, out.deletions, out.insertions


def char_edits(ref: str, hyp: str) -> int:
    """Character edit distance of two normalized strings."""
    if not ref or not hyp:
        return max(len(ref), len(hyp))
    out = jiwer.process_characters(ref, hyp)
    return out.substitutions + out.deletions + out.insertions


def error_rates(refs: list[str], hyps: list[str]) -> ErrorRates:
    """Corpus-level error rates of hyps against refs (both normalized first)."""
    if len(refs) != len(hyps):
        raise ValueError(f"{len(refs)} references but {len(hyps)} hypotheses")
    subs = dels = ins = ref_words = hyp_words = char_err = ref_chars = 0
    for r, h in zip(map(normalize, refs), map(normalize, hyps), strict=True):
        s, d, i = word_edits(r, h)
        subs, dels, ins = subs + s, dels + d, ins + i
        ref_words += len(r.split())
        hyp_words += len(h.split())
        char_err += char_edits(r, h)
        ref_chars += len(r)
    return ErrorRates(
        wer=(subs + dels + ins) / max(1, ref_words),
        cer=char_err / max(1, ref_chars),
        substitutions=subs,
        deletions=dels,
        insertions=ins,
        ref_words=ref_words,
        hyp_words=hyp_words,
        char_errors=char_err,
        ref_chars=ref_chars,
        utterances=len(refs),
    )
