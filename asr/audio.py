"""Audio front end: load (soundfile) -> mono -> resample -> features.

One implementation, shared by data prep (offline features written to shards) and serving
(online features for uploaded audio), so the two can never drift.

Shapes: waveforms are 1-D float32 ``[num_samples]`` in [-1, 1]; features are ``[frames, dims]``.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass
from os import PathLike
from typing import BinaryIO, Literal

import numpy as np
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi
import torchaudio.functional as AF

SAMPLE_RATE = 16_000  # default model rate (Hz)
TELEPHONY_SAMPLE_RATE = 8_000
N_MELS = 80
WINDOW_MS = 25.0  # fbank analysis window
HOP_MS = 10.0  # 100 frames per second
TELEPHONY_WINDOW_MS = 20.0  # 160 samples at 8 kHz -> 81 linear bins
INT16_SCALE = 32768.0  # NOTE: Kaldi computes features on int16-scaled samples; we match it.
FEATURE_DTYPE = np.float16  # storage dtype in shards

AudioSource = str | PathLike | bytes | BinaryIO


class AudioError(ValueError):
    """Audio that cannot be turned into features (unreadable, empty, too short, ...)."""


@dataclass(frozen=True)
class FeatureConfig:
    kind: Literal["fbank", "spectrogram"] = "fbank"  # log-mel filterbank, or log linear spectrogram
    sample_rate: int = SAMPLE_RATE  # audio is resampled to this rate first
    num_mel_bins: int = N_MELS  # fbank only; spectrogram has window_samples // 2 + 1 bins
    window_ms: float = WINDOW_MS
    hop_ms: float = HOP_MS

    @property
    def window_samples(self) -> int:
        return int(self.sample_rate * self.window_ms / 1000)

    @property
    def hop_samples(self) -> int:
        return int(self.sample_rate * self.hop_ms / 1000)

    @property
    def dim(self) -> int:
        return self.num_mel_bins if self.kind == "fbank" else self.window_samples // 2 + 1

    @property
    def frames_per_second(self) -> float:
        return 1000.0 / self.hop_ms

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> FeatureConfig:
        return cls(
            **{k: d[k] for k in ("kind", "sample_rate", "num_mel_bins", "window_ms", "hop_ms") if k in d}
        )


FBANK_16K = FeatureConfig()
SPECTROGRAM_8K = FeatureConfig(
    kind="spectrogram", sample_rate=TELEPHONY_SAMPLE_RATE, window_ms=TELEPHONY_WINDOW_MS
)


def _as_file(source: AudioSource):
    return io.BytesIO(source) if isinstance(source, bytes | bytearray) else source


def load_audio(
    source: AudioSource, start: float | None = None, end: float | None = None
) -> tuple[np.ndarray, int]:
    """Decode audio (wav, flac, ogg, mp3, ...) with soundfile; returns (mono float32 [N], sample_rate).

    ``start``/``end`` (seconds) select a segment of a long recording without decoding the rest.
    """
    try:
        with sf.SoundFile(_as_file(source)) as f:
            sr = f.samplerate
            first = int(round((start or 0.0) * sr))
            last = f.frames if end is None else min(f.frames, int(round(end * sr)))
            if first:
                f.seek(first)
            data = f.read(max(0, last - first), dtype="float32", always_2d=True)  # [N, C]
    except (sf.LibsndfileError, RuntimeError, TypeError) as e:
        raise AudioError(f"cannot decode audio: {e}") from e
    if data.shape[0] == 0:
        raise AudioError("audio is empty")
    return to_mono(data), sr


def to_mono(data: np.ndarray) -> np.ndarray:
    """[N, C] or [N] -> [N] by averaging channels."""
    return data if data.ndim == 1 else data.mean(axis=1, dtype=np.float32)


def resample(wav: torch.Tensor, orig_sr: int, new_sr: int) -> torch.Tensor:
    """[N] -> [N * new_sr / orig_sr]; a no-op when the rates match."""
    if orig_sr == new_sr:
        return wav
    return AF.resample(wav, orig_sr, new_sr)


def num_frames(num_samples: int, cfg: FeatureConfig = FBANK_16K) -> int:
    """Frames ``compute_features`` yields for ``num_samples`` samples (Kaldi's snip_edges)."""
    if num_samples < cfg.window_samples:
        return 0
    return 1 + (num_samples - cfg.window_samples) // cfg.hop_samples


def compute_features(wav: torch.Tensor, cfg: FeatureConfig = FBANK_16K) -> torch.Tensor:
    """[N] float waveform at ``cfg.sample_rate`` in [-1, 1] -> [T, D] float32 log features.

    Kaldi-compatible (torchaudio.compliance.kaldi) with dither off, so the result is deterministic.
    """
    if wav.numel() < cfg.window_samples:
        raise AudioError(f"audio too short for one {cfg.window_ms:g} ms frame ({wav.numel()} samples)")
    x = (wav.to(torch.float32) * INT16_SCALE).unsqueeze(0)  # [1, N]
    common = dict(
        sample_frequency=cfg.sample_rate, frame_length=cfg.window_ms, frame_shift=cfg.hop_ms, dither=0.0
    )
    if cfg.kind == "fbank":
        return kaldi.fbank(x, num_mel_bins=cfg.num_mel_bins, **common)
    if cfg.kind == "spectrogram":
        return kaldi.spectrogram(x, round_to_power_of_two=False, **common)
    raise ValueError(f"unknown feature kind {cfg.kind!r} (expected 'fbank' or 'spectrogram')")


def featurize(
    source: AudioSource, cfg: FeatureConfig = FBANK_16K, start: float | None = None, end: float | None = None
) -> tuple[torch.Tensor, float]:
    """Path/bytes/file -> ([T, D] float32 features, duration in seconds). The one front end."""
    data, sr = load_audio(source, start, end)
    wav = resample(torch.from_numpy(np.ascontiguousarray(data)), sr, cfg.sample_rate)
    return compute_features(wav, cfg), data.shape[0] / sr


def spec_augment(
    feats: torch.Tensor,
    num_freq_masks: int = 2,
    freq_mask_width: int = 27,
    num_time_masks: int = 2,
    time_mask_ratio: float = 0.05,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """SpecAugment (frequency and time masking, no warping) on [T, D] -> [T, D] (a masked copy).

    Time masks are at most ``time_mask_ratio`` of the utterance long, so short utterances keep their content.
    Masked values are set to the utterance mean (zero after CMVN).
    """
    out = feats.clone()
    t, d = out.shape
    fill = out.mean()
    for _ in range(num_freq_masks):
        w = int(torch.randint(0, freq_mask_width + 1, (1,), generator=generator))
        f0 = int(torch.randint(0, max(1, d - w), (1,), generator=generator))
        out[:, f0 : f0 + w] = fill
    max_t = max(0, int(t * time_mask_ratio))
    for _ in range(num_time_masks):
        w = int(torch.randint(0, max_t + 1, (1,), generator=generator))
        t0 = int(torch.randint(0, max(1, t - w), (1,), generator=generator))
        out[t0 : t0 + w, :] = fill
    return out
