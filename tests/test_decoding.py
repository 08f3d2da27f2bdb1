"""Decoding strategies (greedy, beam, beam + n-gram LM) and long-form chunking/stitching/segments."""

from __future__ import annotations

import math

import pytest
import torch

from asr.audio import FBANK_16K
from asr.decoding import (
    DecodingOptions,
    GreedyDecoder,
    arpa_words,
    build_decoder,
    greedy_ctc,
)
from asr.inference import log_probs_batch, output_frames
from asr.longform import ChunkingConfig, Transcriber, make_segments, plan_chunks, split_features, stitch
from asr.model import ASRModel, ModelConfig
from asr.tokenizer import train_tokenizer

WORDS = "cat hat sat on the mat a big red dog ran far".split()
ARPA = """\\data\\
ngram 1=5
ngram 2=2

\\1-grams:
-1.0\t<unk>\t0
-99\t<s>\t0
-1.0\t</s>\t0
-0.3\tcat\t0
-3.0\that\t0

\\2-grams:
-0.1\t<s> cat
-0.1\tcat </s>

\\end\\
"""


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory):
    """A character tokenizer, so tests can spell any word with known pieces."""
    texts = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    return train_tokenizer(texts, tmp_path_factory.mktemp("tok") / "char.model", model_type="char")


def emissions(tokenizer, frames: list[dict[str, float]], floor: float = 1e-4) -> torch.Tensor:
    """Per-frame {piece: prob} (rest blank) -> log-probs [1, T, V]."""
    v = tokenizer.vocab_size
    ids = {tokenizer.id_to_piece(i): i for i in range(v)}
    probs = torch.full((len(frames), v), floor)
    for t, frame in enumerate(frames):
        for piece, p in frame.items():
            probs[t, ids[piece]] = p
        probs[t, 0] = max(floor, 1 - sum(frame.values()))
    return (probs / probs.sum(-1, keepdim=True)).log()[None]


def spell(word: str) -> list[dict[str, float]]:
    """Frames saying ``word`` one piece per frame with a blank frame between pieces."""
    pieces = ["\u2581"] + list(word)
    return [f for p in pieces for f in ({p: 0.9}, {})]


def test_greedy_collapses_repeats_keeps_blank_separated_repeats_and_reports_frames():
    lp = torch.full((2, 6, 4), -10.0)
    # utterance 0: 1 1 blank 1 2 2 -> [1, 1, 2] emitted at frames 0, 3, 4; utterance 1 uses 3 of 6 frames
    for t, k in enumerate([1, 1, 0, 1, 2, 2]):
        lp[0, t, k] = 0.0
    for t, k in enumerate([3, 3, 3, 1, 1, 1]):
        lp[1, t, k] = 0.0
    lengths = torch.tensor([6, 3])
    assert greedy_ctc(lp, lengths) == [[1, 1, 2], [3]]

    class Ids:  # the decoder only needs blank_id and decode() from a tokenizer
        blank_id = 0

        def decode(self, ids):
            return ",".join(map(str, ids))

    results = GreedyDecoder(Ids()).decode(lp, lengths)
    assert [r.tokens for r in results] == [(1, 1, 2), (3,)]
    assert [r.frames for r in results] == [(0, 3, 4), (0,)]
    assert results[0].text == "1,1,2" and results[0].score == pytest.approx(0.0)


def test_beam_without_lm_matches_greedy_on_confident_emissions(char_tokenizer):
    lp = emissions(char_tokenizer, spell("big") + spell("dog"))
    lengths = torch.tensor([lp.shape[1]])
    greedy = build_decoder(DecodingOptions(), char_tokenizer).decode(lp, lengths)[0]
    beam = build_decoder(DecodingOptions(strategy="beam", beam_size=4), char_tokenizer).decode(lp, lengths)[0]
    assert greedy.text == "big dog"
    assert beam.text == greedy.text and beam.tokens == greedy.tokens
    assert len(beam.frames) == len(beam.tokens) and list(beam.frames) == sorted(beam.frames)


def test_beam_with_ngram_lm_prefers_the_likely_word(char_tokenizer, tmp_path):
    """Acoustics slightly prefer "hat"; the LM strongly prefers "cat" and wins only when it is used."""
    frames = spell("cat")
    frames[2] = {"c": 0.4, "h": 0.5}  # the first letter is ambiguous
    lp = emissions(char_tokenizer, frames)
    lengths = torch.tensor([lp.shape[1]])
    lm = tmp_path / "lm.arpa"
    lm.write_text(ARPA, encoding="utf-8")
    assert arpa_words(lm) == ["cat", "hat"]

    no_lm = build_decoder(DecodingOptions(strategy="beam"), char_tokenizer).decode(lp, lengths)[0]
    with_lm = DecodingOptions(strategy="beam", lm=str(lm), lm_weight=2.0)
    lm_result = build_decoder(with_lm, char_tokenizer).decode(lp, lengths)[0]
    assert no_lm.text == "hat"
    assert lm_result.text == "cat"


def test_decoding_options_reject_unknown_strategy():
    with pytest.raises(ValueError, match="strategy"):
        DecodingOptions(strategy="sampling")


@pytest.mark.parametrize("factor", [4, 8])
def test_chunks_cover_the_recording_on_the_subsampling_grid(factor):
    cfg = ChunkingConfig(chunk_s=10.0, overlap_s=2.0)
    for num_frames in (5, 999, 1000, 1001, 4321, 60_000):
        spans = plan_chunks(num_frames, cfg, FBANK_16K, factor)
        assert spans[0][0] == 0 and spans[-1][1] == num_frames
        assert all(s % factor == 0 for s, _ in spans)
        assert all(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))  # consecutive chunks overlap


@pytest.mark.parametrize("factor", [4, 8])
def test_stitching_puts_every_output_frame_at_its_global_position(factor):
    """Features carry their own frame index; a local fake model maps chunks to outputs; the stitched output
    must equal the whole-recording output, frame for frame."""
    feats = torch.arange(4321, dtype=torch.float32)[:, None].repeat(1, 2)  # [T, 2], feats[t] = t
    chunks, spans = split_features(feats, ChunkingConfig(chunk_s=10.0, overlap_s=2.0), FBANK_16K, factor)
    fake = [c[::factor][: output_frames(c.shape[0], factor)] for c in chunks]  # [t'_i, 2] "log-probs"
    stitched = stitch(fake, spans, factor)
    assert stitched.shape[0] == output_frames(feats.shape[0], factor)
    assert torch.equal(stitched[:, 0], torch.arange(stitched.shape[0]) * float(factor))


def test_segments_split_at_pauses_between_words(char_tokenizer):
    frames = spell("big") + [{}] * 30 + spell("dog")  # 30 blank frames = 1.2 s of silence
    lp = emissions(char_tokenizer, frames)
    result = GreedyDecoder(char_tokenizer).decode(lp, torch.tensor([lp.shape[1]]))[0]
    frame_s = factor_seconds = 4 / FBANK_16K.frames_per_second
    segments = make_segments(result, char_tokenizer, frame_s, duration=10.0, cfg=ChunkingConfig(pause_s=0.8))
    assert [s.text for s in segments] == ["big", "dog"]
    assert segments[0].start == 0.0 and segments[0].end < segments[1].start
    assert segments[1].start == pytest.approx((len(spell("big")) + 30) * factor_seconds)
    assert [s.id for s in segments] == [0, 1]


def test_transcriber_of_a_short_recording_equals_one_forward_pass(char_tokenizer):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=char_tokenizer.vocab_size, d_model=32, num_layers=1, num_heads=2)
    model = ASRModel(cfg).eval()
    decoder = GreedyDecoder(char_tokenizer)
    transcriber = Transcriber(
        model, decoder, char_tokenizer, FBANK_16K, ChunkingConfig(chunk_s=4, overlap_s=1)
    )
    short, long = torch.randn(300, 80), torch.randn(2000, 80)
    out = transcriber([(short, 3.0), (long, 20.0)])
    lp = log_probs_batch(model, [short])[0]
    assert out[0].text == decoder.decode(lp[None], torch.tensor([lp.shape[0]]))[0].text
    assert len(out[1].result.tokens) == len(out[1].result.frames)
    assert max(out[1].result.frames, default=0) < output_frames(2000)
    assert all(0 <= s.start <= s.end <= 20.0 for s in out[1].segments)
    assert math.isclose(out[1].duration, 20.0)
