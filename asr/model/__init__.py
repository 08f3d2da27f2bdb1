"""The acoustic model: conv subsampling, transformer/conformer encoder, CTC head, built from ``ModelConfig``."""

from asr.model.asr_model import ASRModel
from asr.model.config import ModelConfig
from asr.model.ctc import ctc_log_probs, ctc_loss
from asr.model.subsampling import subsampled_lengths

__all__ = ["ASRModel", "ModelConfig", "ctc_log_probs", "ctc_loss", "subsampled_lengths"]
