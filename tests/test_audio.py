"""Audio front end: Kaldi-compatible fbank, 8 kHz spectrogram, resampling, down-mix, formats, segments, errors."""

from __future__ import annotations

import io
import json
import wave

import numpy as np
import pytest
import soundfile as sf
import torch
import torchaudio.compliance.kaldi as kaldi

from asr.audio import FBANK_16K, SPECTROGRAM_8K, AudioError, featurize, load_audio, num_frames, resample

# NOTE: same float32 arithmetic as the reference on exactly representable int16 samples: differences are
# rounding only. Stored float16 adds at most half a float16 step (1/128 for |x| < 32).
FBANK_ATOL = 1e-4
FP16_ATOL = 1 / 128


@pytest.fixture(scope="module")
def speech(speech_corpus):
    """Path of a 16 kHz 16-bit espeak utterance."""
    row = json.loads(speech_corpus["dev"].read_text().splitlines()[0])
    return speech_corpus["dev"].parent / row["audio"]


def int16_samples(path) -> tuple[torch.Tensor, int]:
    """Independent of soundfile: the WAV's int16 samples as float32, via the stdlib wave module."""
    with wave.open(str(path)) as w:
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32)
        return torch.from_numpy(data), w.getframerate()


def test_fbank_matches_torchaudio_kaldi_fbank(speech):
    samples, sr = int16_samples(speech)
    ref = kaldi.fbank(samples[None], num_mel_bins=80, frame_length=25.0, frame_shift=10.0, dither=0.0)
    feats, duration = featurize(speech)
    assert sr == 16_000 and feats.shape == ref.shape and feats.shape[1] == 80
    assert duration == pytest.approx(samples.numel() / sr)
    assert (feats - ref).abs().max() <= FBANK_ATOL
    stored = torch.from_numpy(feats.numpy().astype(np.float16)).float()  # what shards hold
    assert (stored - ref).abs().max() <= FP16_ATOL


def test_telephony_spectrogram_has_81_bins(speech):
    wav, sr = load_audio(speech)
    audio8k = resample(torch.from_numpy(wav), sr, 8000).numpy()
    buf = io.BytesIO()
    sf.write(buf, audio8k, 8000, format="WAV", subtype="PCM_16")
    feats, _ = featurize(buf.getvalue(), SPECTROGRAM_8K)
    assert SPECTROGRAM_8K.dim == 81 and feats.shape[1] == 81
    assert feats.shape[0] == num_frames(len(audio8k), SPECTROGRAM_8K) == 1 + (len(audio8k) - 160) // 80
    assert torch.isfinite(feats).all()


def test_resampling_keeps_duration_and_pitch():
    sr, tone = 44_100, 1000.0
    t = np.arange(sr) / sr  # 1 s
    wav = torch.from_numpy((0.5 * np.sin(2 * np.pi * tone * t)).astype(np.float32))
    out = resample(wav, sr, 16_000)  # [16000]
    assert out.numel() == 16_000
    spectrum = np.abs(np.fft.rfft(out.numpy()))
    assert abs(np.argmax(spectrum) * 16_000 / out.numel() - tone) <= 1.0  # 1 Hz bins
    buf = io.BytesIO()
    sf.write(buf, wav.numpy(), sr, format="WAV")
    feats, duration = featurize(buf.getvalue(), FBANK_16K)
    assert duration == pytest.approx(1.0) and feats.shape[0] == num_frames(16_000)


def test_stereo_is_downmixed_to_the_channel_mean(speech):
    wav, sr = load_audio(speech)
    stereo = np.stack([wav, np.zeros_like(wav)], axis=1)  # [N, 2]: speech left, silence right
    bufs = [io.BytesIO(), io.BytesIO()]
    sf.write(bufs[0], stereo, sr, format="WAV", subtype="FLOAT")
    sf.write(bufs[1], wav / 2, sr, format="WAV", subtype="FLOAT")
    mixed, _ = load_audio(bufs[0].getvalue())
    assert mixed.ndim == 1
    np.testing.assert_allclose(mixed, wav / 2, atol=1e-7)
    a, _ = featurize(bufs[0].getvalue())
    b, _ = featurize(bufs[1].getvalue())
    assert (a - b).abs().max() <= FBANK_ATOL


def test_formats_paths_bytes_and_files_agree(speech, tmp_path):
    wav, sr = load_audio(speech)
    ref, _ = featurize(speech)
    sf.write(tmp_path / "x.flac", wav, sr, subtype="PCM_16")
    assert torch.equal(featurize(tmp_path / "x.flac")[0], ref)  # lossless
    assert torch.equal(featurize(speech.read_bytes())[0], ref)
    with open(speech, "rb") as f:
        assert torch.equal(featurize(f)[0], ref)
    for fmt in ("OGG", "MP3"):
        path = tmp_path / f"x.{fmt.lower()}"
        sf.write(path, wav, sr, format=fmt)
        feats, duration = featurize(path)
        assert duration == pytest.approx(len(wav) / sr, abs=0.1) and feats.shape[1] == 80


def test_segment_of_a_long_recording(speech):
    feats, duration = featurize(speech, start=0.5, end=1.25)
    assert duration == pytest.approx(0.75) and feats.shape[0] == num_frames(12_000)
    full, _ = featurize(speech)
    assert (feats[:10] - full[50:60]).abs().max() <= FBANK_ATOL  # 0.5 s = 50 hops


def test_bad_audio_raises_audio_error(tmp_path):
    sf.write(tmp_path / "empty.wav", np.zeros(0), 16_000)
    with pytest.raises(AudioError, match="empty"):
        featurize(tmp_path / "empty.wav")
    with pytest.raises(AudioError, match="too short"):
        featurize(_wav_bytes(np.zeros(100)))
    with pytest.raises(AudioError, match="cannot decode"):
        featurize(b"definitely not audio" * 100)


def _wav_bytes(samples: np.ndarray, sr: int = 16_000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, sr, format="WAV", subtype="PCM_16")
    return buf.getvalue()
