"""4x or 8x subsampling of the feature sequence: (8x: stack frame pairs), two stride-2 3x3 convs, a projection."""

from __future__ import annotations

import torch
from torch import nn

KERNEL = 3
STRIDE = 2
FACTORS = (4, 8)  # 8 = frame pairs stacked, then the two convs: half the encoder cost of 4


def subsampled_lengths(lengths: torch.Tensor | int, factor: int = 4) -> torch.Tensor | int:
    """Output frame counts of ``ConvSubsampling(factor=factor)``: [B] -> [B] (or an int -> an int)."""
    lengths = lengths // (factor // 4)  # 8x: frame pairs
    for _ in range(2):
        lengths = (lengths - KERNEL) // STRIDE + 1
    return lengths.clamp(min=0) if isinstance(lengths, torch.Tensor) else max(0, lengths)


class ConvSubsampling(nn.Module):
    """[B, T, D] -> [B, T', d_model] with T' = ((T - 1) // 2 - 1) // 2.

    NOTE: few channels on purpose: the first conv runs at the full frame rate, so on a CPU a wide
    subsampling costs more than the whole encoder of a tiny model.
    """

    def __init__(self, input_dim: int, d_model: int, channels: int, factor: int = 4):
        super().__init__()
        if factor not in FACTORS:
            raise ValueError(f"subsampling factor must be one of {FACTORS}, got {factor}")
        self.stack = factor // 4
        input_dim *= self.stack
        self.conv = nn.Sequential(
            nn.Conv2d(1, channels, KERNEL, STRIDE),
            nn.ReLU(),
            nn.Conv2d(channels, channels, KERNEL, STRIDE),
            nn.ReLU(),
        )
        freq = ((input_dim - 1) // 2 - 1) // 2
        self.proj = nn.Linear(channels * freq, d_model)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.stack > 1:  # [B, T, D] -> [B, T / s, s * D]
            b, t, d = x.shape
            x = x[:, : t - t % self.stack].reshape(b, t // self.stack, d * self.stack)
        x = self.conv(x.unsqueeze(1))  # [B, C, T', F']
        b, c, t, f = x.shape
        x = self.proj(x.transpose(1, 2).reshape(b, t, c * f))  # [B, T', d_model]
        return x, subsampled_lengths(lengths, self.stack * 4)
