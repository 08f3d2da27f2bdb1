"""CTC loss computed in float32, whatever autocast is active."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ctc_log_probs(logits: torch.Tensor) -> torch.Tensor:
    """[B, T, V] logits (any dtype) -> [B, T, V] float32 log-probabilities, outside autocast.

    NOTE: under fp16/bf16 autocast a low-precision log-softmax loses the small probabilities CTC sums over.
    """
    with torch.autocast(device_type=logits.device.type, enabled=False):
        return logits.float().log_softmax(dim=-1)


def ctc_loss(
    logits: torch.Tensor,
    out_lens: torch.Tensor,
    targets: torch.Tensor,
    target_lens: torch.Tensor,
    blank_id: int = 0,
) -> torch.Tensor:
    """Mean CTC loss per target token (float32 scalar).

    logits [B, T, V], out_lens [B], targets [B, S] (padded), target_lens [B]. Infeasible alignments
    (more tokens than frames) contribute zero instead of inf.
    """
    log_probs = ctc_log_probs(logits)
    with torch.autocast(device_type=logits.device.type, enabled=False):
        total = F.ctc_loss(
            log_probs.transpose(0, 1),  # [T, B, V]
            targets,
            out_lens,
            target_lens,
            blank=blank_id,
            reduction="sum",
            zero_infinity=True,
        )
    return total / target_lens.sum().clamp(min=1)
