"""``ASRModel``: global CMVN -> 4x/8x conv subsampling -> encoder -> CTC head. A plain ``nn.Module``."""

from __future__ import annotations

import math

import torch
from torch import nn

from asr.model.config import ModelConfig
from asr.model.encoder import Encoder
from asr.model.layers import sinusoidal_table
from asr.model.subsampling import ConvSubsampling

MIN_STD = 1e-5  # floor for CMVN standard deviations (constant feature dims)


class ASRModel(nn.Module):
    """CTC acoustic model over RAW features; the global CMVN lives inside as buffers (see ``set_cmvn``)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.register_buffer("cmvn_mean", torch.zeros(cfg.input_dim))
        self.register_buffer("cmvn_std", torch.ones(cfg.input_dim))
        self.subsampling = ConvSubsampling(
            cfg.input_dim, cfg.d_model, cfg.subsampling_channels, cfg.subsampling_factor
        )
        self.register_buffer("positions", sinusoidal_table(cfg.max_positions, cfg.d_model), persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)
        self.encoder = Encoder(cfg)
        self.ctc_head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def set_cmvn(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Set global feature normalization: features are mapped to ``(x - mean) / std``. [D], [D]."""
        self.cmvn_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.cmvn_std.copy_(torch.as_tensor(std, dtype=torch.float32).clamp(min=MIN_STD))

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """feats [B, T, D] raw features, feat_lens [B] -> (logits [B, T', V], out_lens [B]), T' ~ T / subsampling_factor."""
        x = (feats.float() - self.cmvn_mean) / self.cmvn_std  # [B, T, D]
        x, out_lens = self.subsampling(x, feat_lens)  # [B, T', d]
        t = x.shape[1]
        if t > self.positions.shape[0]:
            raise ValueError(
                f"input of {t} subsampled frames exceeds max_positions {self.positions.shape[0]}"
            )
        x = self.dropout(x * math.sqrt(self.cfg.d_model) + self.positions[:t].to(x.dtype))
        key_mask = torch.arange(t, device=x.device)[None, :] < out_lens[:, None]  # [B, T'] True = real
        x = self.encoder(x, key_mask)
        return self.ctc_head(x), out_lens

    def num_parameters(self) -> int:
        """Trainable parameter count."""
        return sum(p.numel() for p in self.parameters() if p.requires_grad)
