"""``ASRSystem``: the LightningModule that trains an ``ASRModel`` with CTC (loss, metrics, optimizer).

Drop it into any ``lightning.Trainer`` with batches from ``asr.data`` (dicts of feats, feat_lens, targets,
target_lens, keys, texts, audio_seconds). Log-softmax and CTC run in float32 under any precision.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning as L
import torch

from asr.data import is_empty
from asr.decoding import greedy_ctc
from asr.model import ASRModel, ModelConfig, ctc_loss
from asr.scoring import error_rates
from asr.tokenizer import Tokenizer

SCHEDULES = ("noam", "cosine", "cosine_time", "constant")
VAL_SUMS = ("loss", "tokens", "word_errors", "ref_words", "char_errors", "ref_chars")  # reduced over ranks


@dataclass
class OptimConfig:
    lr: float = 1e-3  # peak learning rate, reached after warm-up
    beta1: float = 0.9
    beta2: float = 0.98
    eps: float = 1e-9
    weight_decay: float = 1e-3  # not applied to biases and norms
    warmup_steps: int = 500  # linear warm-up from 0
    schedule: str = (
        "noam"  # after warm-up: "noam" (inverse sqrt), "cosine" (to min_lr_ratio), "cosine_time", "constant"
    )
    total_steps: int = 0  # cosine only; python -m asr.train fills 0 from max_steps or max_epochs
    total_seconds: float = (
        0.0  # cosine_time only (cosine over training wall time); filled from trainer.max_time
    )
    min_lr_ratio: float = 0.05  # cosine floor, as a fraction of lr

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")


def lr_factor(step: int, cfg: OptimConfig, total_steps: int, time_fraction: float = 0.0) -> float:
    """Multiplier of ``cfg.lr`` at optimizer step ``step``: linear warm-up, then the configured decay.

    ``time_fraction`` (cosine_time): the fraction of the run's time budget spent so far.
    NOTE: a run bounded by wall time (the demo's 20 CPU minutes) has no known step count; decaying over the
    time budget anneals the learning rate exactly when the budget ends, whatever the machine's speed.
    """
    warmup = max(1, cfg.warmup_steps)
    if step < warmup:
        return (step + 1) / warmup
    if cfg.schedule == "noam":
        return math.sqrt(warmup / (step + 1))
    if cfg.schedule in ("cosine", "cosine_time"):
        if cfg.schedule == "cosine":
            progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        else:
            progress = min(1.0, time_fraction)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    return 1.0


class ASRSystem(L.LightningModule):
    """CTC training of ``ASRModel(model_cfg)``; validation loss, greedy WER and CER.

    ``tokenizer`` turns token ids back to text for WER/CER (omit it to skip them). ``record_keys_dir``
    (debug) appends ``step, epoch, wrap, key`` of every trained utterance to ``keys-rank{R}.tsv`` there.
    """

    def __init__(
        self,
        model_cfg: ModelConfig,
        optim: OptimConfig,
        tokenizer: Tokenizer | None = None,
        record_keys_dir: str | None = None,
    ):
        super().__init__()
        self.save_hyperparameters({"model": model_cfg.to_dict(), "optim": asdict(optim)})
        self.model = ASRModel(model_cfg)
        self.optim_cfg = optim
        self.tokenizer = tokenizer
        self.record_keys_dir = record_keys_dir
        self.audio_seconds = 0.0  # trained audio on this rank, across resumes
        self.train_seconds = 0.0  # fit wall time before this process (restored from checkpoints)
        self.val_history: list[dict] = []  # {"step", "loss", "wer", "cer"} per validation
        self._fit_start = time.perf_counter()
        self._window = self._new_window(time.perf_counter())  # training figures since the last log
        self._val_sums: torch.Tensor | None = None

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """feats [B, T, D], feat_lens [B] -> (logits [B, T', V], out_lens [B])."""
        return self.model(feats, feat_lens)

    # --- training ----------------------------------------------------------------------------------------

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        self._record_keys(batch)
        if is_empty(batch):  # every sample was dropped: a zero loss keeps DDP ranks in step
            return sum(p.sum() for p in self.model.parameters()) * 0.0
        logits, out_lens = self.model(batch["feats"], batch["feat_lens"])
        loss = ctc_loss(logits, out_lens, batch["targets"], batch["target_lens"], self.model_blank_id)
        self._log_batch(batch, loss)
        return loss

    @property
    def model_blank_id(self) -> int:
        return self.tokenizer.blank_id if self.tokenizer is not None else 0

    def _log_batch(self, batch: dict, loss: torch.Tensor) -> None:
        """Loss every step; the other figures over the window since the last logging step (cheaper, smoother)."""
        n = len(batch["keys"])
        self.audio_seconds += batch["audio_seconds"]
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        w = self._window
        lens = batch["feat_lens"]
        w["audio"] += batch["audio_seconds"]
        w["real"] += int(lens.sum())
        w["padded"] += lens.numel() * int(lens.max())
        w["utterances"] += n
        w["batches"] += 1
        w["dropped"] += sum(batch.get("drops", {}).values())
        if self.global_step % max(1, self.trainer.log_every_n_steps) == 0:
            self._log_window()

    def _log_window(self) -> None:
        w, now = self._window, time.perf_counter()
        self.log_dict(
            {
                "train/padding_efficiency": w["real"] / max(1, w["padded"]),
                "train/batch_utterances": w["utterances"] / max(1, w["batches"]),
                "train/dropped": float(w["dropped"]),
                "train/audio_s_per_s": w["audio"] / max(1e-9, now - w["start"]),
            }
        )
        self._window = self._new_window(now)

    @staticmethod
    def _new_window(start: float) -> dict:
        return dict(start=start, audio=0.0, real=0, padded=0, utterances=0, batches=0, dropped=0)

    def _record_keys(self, batch: dict) -> None:
        if not self.record_keys_dir:
            return
        path = Path(self.record_keys_dir) / f"keys-rank{self.global_rank}.tsv"
        lines = "".join(
            f"{self.global_step}\t{batch.get('epoch', self.current_epoch)}\t{batch.get('wrap', 0)}\t{k}\n"
            for k in batch["keys"]
        )
        with path.open("a", encoding="utf-8") as f:  # NOTE: appended per step, so a kill -9 keeps it
            f.write(lines)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.global_step % max(1, self.trainer.log_every_n_steps) == 0:
            grads = [p.grad.detach().norm() for p in self.model.parameters() if p.grad is not None]
            if grads:
                self.log("train/grad_norm", torch.stack(grads).norm())

    # --- validation --------------------------------------------------------------------------------------

    def on_validation_epoch_start(self) -> None:
        self._val_sums = torch.zeros(len(VAL_SUMS), dtype=torch.float64, device=self.device)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        if is_empty(batch):
            return
        logits, out_lens = self.model(batch["feats"], batch["feat_lens"])
        tokens = batch["target_lens"].sum()
        loss = ctc_loss(logits, out_lens, batch["targets"], batch["target_lens"], self.model_blank_id)
        sums = [float(loss) * float(tokens), float(tokens), 0.0, 0.0, 0.0, 0.0]
        if self.tokenizer is not None:
            hyps = [
                self.tokenizer.decode(ids)
                for ids in greedy_ctc(logits.float(), out_lens, self.model_blank_id)
            ]
            er = error_rates(batch["texts"], hyps)
            word_errors = er.substitutions + er.deletions + er.insertions
            sums[2:] = [word_errors, er.ref_words, er.char_errors, er.ref_chars]
        self._val_sums += torch.tensor(sums, dtype=torch.float64, device=self.device)

    def on_validation_epoch_end(self) -> None:
        sums = dict(
            zip(VAL_SUMS, self.trainer.strategy.reduce(self._val_sums, reduce_op="sum").tolist(), strict=True)
        )
        if sums["tokens"] == 0:
            return
        result = {
            "step": self.global_step,
            "loss": sums["loss"] / sums["tokens"],
            "wer": sums["word_errors"] / max(1.0, sums["ref_words"]),
            "cer": sums["char_errors"] / max(1.0, sums["ref_chars"]),
        }
        # NOTE: already reduced over ranks, so every rank logs the same value without another sync
        self.log("val/loss", result["loss"], prog_bar=True)
        self.log("val/wer", result["wer"], prog_bar=True)
        self.log("val/cer", result["cer"])
        if not self.trainer.sanity_checking:
            self.val_history.append(result)

    # --- optimizer, checkpoint state ---------------------------------------------------------------------

    def configure_optimizers(self):
        cfg = self.optim_cfg
        decay = [p for p in self.model.parameters() if p.ndim >= 2]
        no_decay = [p for p in self.model.parameters() if p.ndim < 2]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=cfg.lr,
            betas=(cfg.beta1, cfg.beta2),
            eps=cfg.eps,
        )
        # NOTE: not trainer.estimated_stepping_batches: it iterates the train loader before a resumed
        # loader state is restored, and Lightning then never restores it (train.py sets total_steps)
        if cfg.schedule == "cosine" and cfg.total_steps <= 0:
            raise ValueError("optim.total_steps must be set for the cosine schedule")
        if cfg.schedule == "cosine_time" and cfg.total_seconds <= 0:
            raise ValueError(
                "optim.total_seconds (or trainer.max_time) must be set for the cosine_time schedule"
            )
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer,
            lambda step: lr_factor(
                step, cfg, cfg.total_steps, self.fit_seconds() / max(1e-9, cfg.total_seconds)
            ),
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_fit_start(self) -> None:
        self._fit_start = time.perf_counter()
        self._window = self._new_window(self._fit_start)

    def fit_seconds(self) -> float:
        """Training wall time across all resumed segments of this run."""
        return self.train_seconds + time.perf_counter() - self._fit_start

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["asr_progress"] = {
            "audio_seconds": self.audio_seconds,
            "train_seconds": self.fit_seconds(),
            "val_history": self.val_history,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        progress = checkpoint.get("asr_progress", {})
        self.audio_seconds = progress.get("audio_seconds", 0.0)
        self.train_seconds = progress.get("train_seconds", 0.0)
        self.val_history = list(progress.get("val_history", []))
