"""Batched, gradient-free acoustic model inference: a list of feature matrices in, CTC log-probs out."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pad_sequence

from asr.model import subsampled_lengths

MIN_INPUT_FRAMES = 7  # the conv subsampling's receptive field: shorter inputs yield no output frame


def pad_features(feats: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """[T_i, D] each -> (padded [B, T_max, D] float32, lengths [B] long)."""
    lengths = torch.tensor([f.shape[0] for f in feats], dtype=torch.long)
    x = pad_sequence([f.float() for f in feats], batch_first=True)  # [B, T_max, D]
    if x.shape[1] < MIN_INPUT_FRAMES:  # NOTE: so the convolutions run; such items get 0 output frames
        x = torch.nn.functional.pad(x, (0, 0, 0, MIN_INPUT_FRAMES - x.shape[1]))
    return x, lengths


@torch.inference_mode()
def log_probs_batch(model: nn.Module, feats: list[torch.Tensor]) -> list[torch.Tensor]:
    """One padded forward pass: [T_i, D] each -> CTC log-probs [T'_i, V] each (float32, on the CPU).

    Padding does not change a sequence's output: the model masks padded frames, so results are the same
    whatever else shares the batch (up to float rounding).
    """
    device = next(model.parameters()).device
    x, lengths = pad_features(feats)  # [B, T, D], [B]
    logits, out_lens = model(x.to(device), lengths.to(device))  # [B, T', V], [B]
    lp = logits.float().log_softmax(dim=-1).cpu()  # [B, T', V]
    return [lp[b, :n] for b, n in enumerate(out_lens.tolist())]


def output_frames(num_feature_frames: int, factor: int = 4) -> int:
    """Model output frames for ``num_feature_frames`` input frames (the conv subsampling's arithmetic)."""
    return int(subsampled_lengths(num_feature_frames, factor))
