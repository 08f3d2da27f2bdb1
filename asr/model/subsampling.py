"""4x convolutional subsampling of the feature sequence (two stride-2 3x3 convs, then a projection)."""

from __future__ import annotations

import torch
from torch import nn

KERNEL = 3
STRIDE = 2


def subsampled_lengths(lengths: torch.Tensor | int) -> torch.Tensor | int:
    """Frame counts after two unpadded stride-2 3x3 convolutions: [B] -> [B] (or an int -> an int)."""
    for _ in range(2):
        lengths = (lengths - KERNEL) // STRIDE + 1
    return lengths.clamp(min=0) if isinstance(lengths, torch.Tensor) else max(0, lengths)


class ConvSubsampling(nn.Module):
    """[B, T, D] -> [B, T', d_model] with T' = ((T - 1) // 2 - 1) // 2.

    NOTE: few channels on purpose: the first conv runs at the full frame rate, so on a CPU a wide
    subsampling costs more than the whole encoder of a tiny model.
    """

    def __init__(self, input_dim: int, d_model: int, channels: int):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(1, channels, KERNEL, STRIDE),
            nn.ReLU(),
            nn.Conv2d(channels, channels, KERNEL, STRIDE),
            nn.ReLU(),
        )
        freq = ((input_dim - 1) // 2 - 1) // 2
        self.proj = nn.Linear(channels * freq, d_model)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.conv(x.unsqueeze(1))  # [B, C, T', F']
        b, c, t, f = x.shape
        x = self.proj(x.transpose(1, 2).reshape(b, t, c * f))  # [B, T', d_model]
        return x, subsampled_lengths(lengths)
