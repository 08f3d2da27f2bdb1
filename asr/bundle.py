"""Self-contained model bundle: weights (CMVN included), model config, feature config and tokenizer in one file.

The file is a ``torch.save``'d dict of plain types and tensors, so evaluation and serving load it with
``torch.load(path, weights_only=True)`` and need nothing else (no Hydra config, no tokenizer file).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from os import PathLike
from pathlib import Path

import torch

from asr.audio import FeatureConfig
from asr.model import ASRModel, ModelConfig
from asr.tokenizer import Tokenizer

BUNDLE_FORMAT_VERSION = 1


@dataclass
class Bundle:
    model: ASRModel  # in eval mode, on the requested device
    feature: FeatureConfig
    tokenizer: Tokenizer
    model_config: ModelConfig
    extra: dict = field(default_factory=dict)  # e.g. training summary, run name


def save_bundle(
    path: str | PathLike,
    model: ASRModel,
    feature_cfg: FeatureConfig,
    tokenizer: Tokenizer,
    extra: dict | None = None,
) -> Path:
    """Write ``model`` (float32 CPU weights), its configs and the tokenizer to ``path`` atomically."""
    if model.cfg.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"model vocab {model.cfg.vocab_size} != tokenizer vocab {tokenizer.vocab_size}")
    if model.cfg.input_dim != feature_cfg.dim:
        raise ValueError(f"model input_dim {model.cfg.input_dim} != feature dim {feature_cfg.dim}")
    payload = {
        "format_version": BUNDLE_FORMAT_VERSION,
        "model_config": model.cfg.to_dict(),
        "state_dict": {k: v.detach().float().cpu().clone() for k, v in model.state_dict().items()},
        "feature": feature_cfg.to_dict(),
        "tokenizer": torch.frombuffer(bytearray(tokenizer.proto), dtype=torch.uint8),
        "extra": dict(extra or {}),
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)
    return path


def load_bundle(path: str | PathLike, device: str | torch.device = "cpu") -> Bundle:
    """Load a bundle written by ``save_bundle``; the model comes back in eval mode on ``device``."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    version = payload.get("format_version")
    if version != BUNDLE_FORMAT_VERSION:
        raise ValueError(f"unsupported bundle format_version {version!r} (expected {BUNDLE_FORMAT_VERSION})")
    cfg = ModelConfig.from_dict(payload["model_config"])
    model = ASRModel(cfg)
    model.load_state_dict(payload["state_dict"])
    return Bundle(
        model=model.to(device).eval(),
        feature=FeatureConfig.from_dict(payload["feature"]),
        tokenizer=Tokenizer(payload["tokenizer"].numpy().tobytes()),
        model_config=cfg,
        extra=payload["extra"],
    )
