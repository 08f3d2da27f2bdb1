"""The one typed config an ``ASRModel`` is built from (also a Hydra structured config: ``conf/model/*.yaml``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from asr.audio import N_MELS

DEFAULT_VOCAB_SIZE = 256  # train.py overwrites it with the tokenizer's size


@dataclass
class ModelConfig:
    encoder: str = "conformer"  # "transformer" or "conformer"
    input_dim: int = N_MELS  # feature dims (80 fbank, 81 telephony spectrogram)
    vocab_size: int = DEFAULT_VOCAB_SIZE  # CTC output classes, blank included (id 0)
    d_model: int = 144
    num_layers: int = 4
    num_heads: int = 4
    ff_mult: int = 4  # feed-forward width = ff_mult * d_model
    conv_kernel: int = 15  # conformer depthwise conv kernel (odd)
    subsampling_channels: int = 32  # conv channels of the subsampling; keep small on CPU
    subsampling_factor: int = 4  # 4 (40 ms output frames) or 8 (80 ms: half the encoder cost; subword units)
    dropout: float = 0.1
    max_positions: int = 10_000  # sinusoidal table length, in subsampled frames (~400 s of audio)
    activation_checkpointing: bool = False  # recompute each layer in backward: less memory, ~30% more compute

    def __post_init__(self) -> None:
        if self.encoder not in ("transformer", "conformer"):
            raise ValueError(f"encoder must be 'transformer' or 'conformer', got {self.encoder!r}")
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model {self.d_model} is not divisible by num_heads {self.num_heads}")
        if self.subsampling_factor not in (4, 8):
            raise ValueError(f"subsampling_factor must be 4 or 8, got {self.subsampling_factor}")
        if self.conv_kernel % 2 == 0:
            raise ValueError(f"conv_kernel must be odd, got {self.conv_kernel}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})
