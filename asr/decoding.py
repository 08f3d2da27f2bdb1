"""CTC decoding strategies."""

from __future__ import annotations

import torch


def greedy_ctc(log_probs: torch.Tensor, lengths: torch.Tensor, blank_id: int = 0) -> list[list[int]]:
    """Best path: argmax per frame, collapse repeats, drop blanks.

    log_probs: [B, T, V] (log-)probabilities or logits; lengths: [B] valid frames. Returns token ids per utterance.
    """
    best = log_probs.argmax(dim=-1).cpu()  # [B, T]
    out = []
    for b, n in enumerate(lengths.tolist()):
        path = torch.unique_consecutive(best[b, :n])
        out.append(path[path != blank_id].tolist())
    return out
