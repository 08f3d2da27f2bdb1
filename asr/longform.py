"""Long audio (minutes to an hour): overlapping feature chunks -> per-chunk CTC log-probs -> stitched -> segments.

Each chunk keeps the model output frames up to the middle of its overlap with the next chunk, so every kept
frame saw at least half an overlap of context on both sides; the stitched log-probs are then decoded once,
as if the model had seen the whole recording, and the token frames give segment start/end times.
Short audio is the one-chunk case of the same path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from asr.audio import FeatureConfig
from asr.bundle import Bundle
from asr.decoding import Decoder, DecodingOptions, DecodingResult, build_decoder
from asr.inference import log_probs_batch
from asr.tokenizer import Tokenizer

WORD_START = "\u2581"  # sentencepiece's word-boundary marker


@dataclass(frozen=True)
class ChunkingConfig:
    chunk_s: float = 30.0  # model input per chunk (bounded memory and attention cost)
    overlap_s: float = 4.0  # shared by consecutive chunks; each side keeps half of it
    pause_s: float = 0.8  # a silence this long between words starts a new segment
    max_segment_s: float = 15.0  # a segment this long is closed at the next word

    def __post_init__(self) -> None:
        if not 0 < 2 * self.overlap_s < self.chunk_s:
            raise ValueError(f"need 0 < 2 * overlap_s < chunk_s, got {self.overlap_s} and {self.chunk_s}")


@dataclass(frozen=True)
class Segment:
    id: int
    start: float  # seconds from the start of the audio
    end: float
    text: str
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class Transcript:
    text: str
    segments: tuple[Segment, ...]
    duration: float  # seconds of audio
    result: DecodingResult  # the whole-recording decoding (tokens and their output frames)


def plan_chunks(
    num_frames: int, cfg: ChunkingConfig, feature: FeatureConfig, factor: int = 4
) -> list[tuple[int, int]]:
    """Feature-frame spans [start, end) covering ``num_frames`` with overlap; starts are multiples of the
    model's subsampling ``factor``, so chunk outputs line up exactly with the whole-recording output grid."""
    fps = feature.frames_per_second
    chunk = max(factor, round(cfg.chunk_s * fps / factor) * factor)
    stride = max(factor, chunk - round(cfg.overlap_s * fps / factor) * factor)
    spans, start = [], 0
    while True:
        spans.append((start, min(start + chunk, num_frames)))
        if start + chunk >= num_frames:
            return spans
        start += stride


def split_features(
    feats: torch.Tensor, cfg: ChunkingConfig, feature: FeatureConfig, factor: int = 4
) -> tuple[list[torch.Tensor], list[tuple[int, int]]]:
    """[T, D] -> (chunks [t_i, D] (views), their spans in feature frames)."""
    spans = plan_chunks(feats.shape[0], cfg, feature, factor)
    return [feats[s:e] for s, e in spans], spans


def stitch(
    chunk_log_probs: list[torch.Tensor], spans: list[tuple[int, int]], factor: int = 4
) -> torch.Tensor:
    """Per-chunk log-probs [t'_i, V] -> one [T', V], cutting each overlap in its middle (output frames)."""
    offsets = [s // factor for s, _ in spans]  # global output frame of each chunk's first frame
    cuts = [0] + [
        (s + (prev_end - s) // 2) // factor
        for (s, _), (_, prev_end) in zip(spans[1:], spans[:-1], strict=True)
    ]
    cuts.append(offsets[-1] + chunk_log_probs[-1].shape[0])
    pieces = [
        lp[max(0, cuts[i] - offsets[i]) : max(0, cuts[i + 1] - offsets[i])]
        for i, lp in enumerate(chunk_log_probs)
    ]
    return torch.cat(pieces, dim=0)


def frame_seconds(feature: FeatureConfig, factor: int = 4) -> float:
    """Seconds per model output frame."""
    return factor / feature.frames_per_second


def make_segments(
    result: DecodingResult, tokenizer: Tokenizer, frame_s: float, duration: float, cfg: ChunkingConfig
) -> list[Segment]:
    """Group tokens into segments at word starts after a pause, or once a segment is ``max_segment_s`` long."""
    groups: list[list[int]] = []  # indices into result.tokens
    for i, (tok, frame) in enumerate(zip(result.tokens, result.frames, strict=True)):
        if groups and not _starts_segment(tokenizer, tok, frame, result, groups[-1], frame_s, cfg):
            groups[-1].append(i)
        else:
            groups.append([i])
    segments = []
    for n, idx in enumerate(groups):
        toks = tuple(result.tokens[i] for i in idx)
        start = result.frames[idx[0]] * frame_s
        end = min(duration, (result.frames[idx[-1]] + 1) * frame_s)
        segments.append(Segment(n, round(start, 3), round(max(start, end), 3), tokenizer.decode(toks), toks))
    return segments


def _starts_segment(
    tokenizer: Tokenizer,
    tok: int,
    frame: int,
    result: DecodingResult,
    group: list[int],
    frame_s: float,
    cfg: ChunkingConfig,
) -> bool:
    if not tokenizer.id_to_piece(tok).startswith(WORD_START):
        return False  # never split inside a word
    pause = (frame - result.frames[group[-1]]) * frame_s
    length = (frame - result.frames[group[0]]) * frame_s
    return pause >= cfg.pause_s or length >= cfg.max_segment_s


class Transcriber:
    """Recordings' features -> Transcripts: all chunks of a batch of recordings go through the model
    ``max_batch`` at a time, then each recording is stitched, decoded and segmented.

    NOTE: not thread-safe (the beam decoder keeps state); serving calls it from one worker thread.
    """

    def __init__(
        self,
        model: nn.Module,
        decoder: Decoder,
        tokenizer: Tokenizer,
        feature: FeatureConfig,
        chunking: ChunkingConfig = ChunkingConfig(),
        max_batch: int = 16,
    ):
        self.model, self.decoder, self.tokenizer = model, decoder, tokenizer
        self.feature, self.chunking, self.max_batch = feature, chunking, max_batch
        # NOTE: a plain nn.Module without a config (tests, other models) is taken to subsample 4x
        self.factor = getattr(getattr(model, "cfg", None), "subsampling_factor", 4)

    @classmethod
    def from_bundle(cls, bundle: Bundle, options: DecodingOptions | None = None, **kwargs) -> Transcriber:
        """A transcriber for a loaded model bundle, decoding with ``options``."""
        decoder = build_decoder(options or DecodingOptions(), bundle.tokenizer)
        return cls(bundle.model, decoder, bundle.tokenizer, bundle.feature, **kwargs)

    def __call__(self, recordings: list[tuple[torch.Tensor, float]]) -> list[Transcript]:
        """[(features [T, D], duration in seconds)] -> one Transcript per recording."""
        plans = [split_features(feats, self.chunking, self.feature, self.factor) for feats, _ in recordings]
        chunks = [c for cs, _ in plans for c in cs]
        lps = self.log_probs(chunks)
        out, i = [], 0
        for (cs, spans), (_, duration) in zip(plans, recordings, strict=True):
            out.append(self._transcript(stitch(lps[i : i + len(cs)], spans, self.factor), duration))
            i += len(cs)
        return out

    def log_probs(self, chunks: list[torch.Tensor]) -> list[torch.Tensor]:
        """Chunks [t_i, D] -> log-probs [t'_i, V], ``max_batch`` per forward pass (longest first: less padding)."""
        order = sorted(range(len(chunks)), key=lambda i: -chunks[i].shape[0])
        out: list[torch.Tensor] = [torch.empty(0)] * len(chunks)
        for k in range(0, len(order), self.max_batch):
            idx = order[k : k + self.max_batch]
            for i, lp in zip(idx, log_probs_batch(self.model, [chunks[i] for i in idx]), strict=True):
                out[i] = lp
        return out

    def _transcript(self, log_probs: torch.Tensor, duration: float) -> Transcript:
        """Stitched log-probs [T', V] -> Transcript."""
        result = self.decoder.decode(log_probs[None], torch.tensor([log_probs.shape[0]]))[0]
        frame_s = frame_seconds(self.feature, self.factor)
        segments = make_segments(result, self.tokenizer, frame_s, duration, self.chunking)
        return Transcript(result.text, tuple(segments), duration, result)
