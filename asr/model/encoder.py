"""Transformer and conformer encoders: a stack of pre-norm layers over subsampled frames."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from asr.model.config import ModelConfig
from asr.model.layers import ConvModule, FeedForward, SelfAttention


class TransformerLayer(nn.Module):
    """Pre-norm transformer layer: x + MHSA(x), then x + FF(x). [B, T, d] -> [B, T, d]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attn = SelfAttention(cfg.d_model, cfg.num_heads, cfg.dropout)
        self.ff = FeedForward(cfg.d_model, cfg.ff_mult, cfg.dropout)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(x, key_mask)
        return x + self.ff(x)


class ConformerLayer(nn.Module):
    """Conformer layer (Gulati et al. 2020): half FF, MHSA, conv module, half FF, final norm."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ff1 = FeedForward(cfg.d_model, cfg.ff_mult, cfg.dropout)
        self.attn = SelfAttention(cfg.d_model, cfg.num_heads, cfg.dropout)
        self.conv = ConvModule(cfg.d_model, cfg.conv_kernel, cfg.dropout)
        self.ff2 = FeedForward(cfg.d_model, cfg.ff_mult, cfg.dropout)
        self.norm = nn.LayerNorm(cfg.d_model)

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        x = x + 0.5 * self.ff1(x)
        x = x + self.attn(x, key_mask)
        x = x + self.conv(x, key_mask)
        x = x + 0.5 * self.ff2(x)
        return self.norm(x)


class Encoder(nn.Module):
    """A stack of ``cfg.num_layers`` transformer or conformer layers: [B, T, d] -> [B, T, d]."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        layer = TransformerLayer if cfg.encoder == "transformer" else ConformerLayer
        self.layers = nn.ModuleList(layer(cfg) for _ in range(cfg.num_layers))
        self.final_norm = nn.LayerNorm(cfg.d_model) if cfg.encoder == "transformer" else nn.Identity()
        self.activation_checkpointing = cfg.activation_checkpointing

    def forward(self, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if self.activation_checkpointing and self.training:
                x = checkpoint(layer, x, key_mask, use_reentrant=False)
            else:
                x = layer(x, key_mask)
        return self.final_norm(x)
