"""Building blocks shared by the transformer and conformer encoders."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def sinusoidal_table(max_positions: int, d_model: int) -> torch.Tensor:
    """[max_positions, d_model] absolute sinusoidal position encodings (Vaswani et al.)."""
    pos = torch.arange(max_positions, dtype=torch.float32).unsqueeze(1)  # [P, 1]
    inv = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10_000.0) / d_model))
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(pos * inv)
    table[:, 1::2] = torch.cos(pos * inv)
    return table


class FeedForward(nn.Module):
    """Pre-norm position-wise feed-forward: [B, T, d] -> [B, T, d] (residual added by the caller)."""

    def __init__(self, d_model: int, ff_mult: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.LayerNorm(d_model),
            nn.Linear(d_model, ff_mult * d_model),
            nn.SiLU(),
            nn.Dropout(dropout),
            nn.Linear(ff_mult * d_model, d_model),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SelfAttention(nn.Module):
    """Pre-norm multi-head self-attention over unpadded keys: [B, T, d] -> [B, T, d]."""

    def __init__(self, d_model: int, num_heads: int, dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)
        self.num_heads = num_heads
        self.dropout = dropout

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """``key_mask`` [B, T] is True on real frames."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, t, 3, self.num_heads, d // self.num_heads).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))  # [B, H, T, d/H]
        attn_mask = key_mask[:, None, None, :]  # [B, 1, 1, T] broadcast over heads and queries
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)  # [B, H, T, d/H]
        return F.dropout(self.out(y.transpose(1, 2).reshape(b, t, d)), p, self.training)


class ConvModule(nn.Module):
    """Conformer convolution module: pointwise+GLU, depthwise conv, norm, SiLU, pointwise. [B, T, d] -> [B, T, d]."""

    def __init__(self, d_model: int, kernel: int, dropout: float):
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.pointwise_in = nn.Conv1d(d_model, 2 * d_model, 1)
        self.depthwise = nn.Conv1d(d_model, d_model, kernel, padding=kernel // 2, groups=d_model)
        # NOTE: LayerNorm over channels instead of BatchNorm: batch statistics over padded dynamic
        # batches are noisy and differ between training and inference.
        self.mid_norm = nn.LayerNorm(d_model)
        self.pointwise_out = nn.Conv1d(d_model, d_model, 1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        x = F.glu(self.pointwise_in(self.norm(x).transpose(1, 2)), dim=1)  # [B, d, T]
        x = self.depthwise(
            x.masked_fill(~key_mask.unsqueeze(1), 0.0)
        )  # padding must not leak into real frames
        x = F.silu(self.mid_norm(x.transpose(1, 2)))  # [B, T, d]
        return self.dropout(self.pointwise_out(x.transpose(1, 2)).transpose(1, 2))
