"""Training entry point: shards -> model, on a laptop CPU or many GPU nodes, from one Hydra config.

    python -m asr.train data.train_dir=shards/train data.val_dir=shards/dev data.tokenizer=tok.model
    python -m asr.train model=base trainer=gpu trainer.devices=8 trainer.num_nodes=4   # under torchrun/SLURM
    python -m asr.train -m optim.lr=1e-3,3e-3                                          # a sweep

Writes into the run directory: checkpoints/ (every N steps, last.ckpt, best.ckpt), tb/ (TensorBoard),
summary.json and bundle.pt (the self-contained model for evaluation and serving).
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import random
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import hydra
import lightning as L
import numpy as np
import torch
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.callbacks import EarlyStopping, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy
from omegaconf import DictConfig, OmegaConf

from asr.bundle import save_bundle
from asr.datamodule import DataConfig, ShardDataModule
from asr.model import ModelConfig
from asr.system import ASRSystem, OptimConfig

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
LAST_CHECKPOINT = "last.ckpt"
BEST_CHECKPOINT = "best"  # best.ckpt: lowest validation loss
SUMMARY_FILE = "summary.json"
BUNDLE_FILE = "bundle.pt"
CONVERGENCE_TOLERANCE = 0.01  # converged: validation loss within 1% of the run's minimum (Hestness et al.)
SECONDS_PER_HOUR = 3600.0
# NOTE: our IterableDataset's length is exact by design (each rank and worker reads its own shards, padded to
# a fixed step count), so Lightning's caution about __len__ with several workers does not apply
warnings.filterwarnings("ignore", message=".*Your `IterableDataset` has `__len__` defined.*")


MONITORS = ("val/loss", "val/wer", "val/cer")


@dataclass
class TrainerConfig:
    accelerator: str = "cpu"  # cpu, gpu, auto
    devices: int = 1  # per node
    num_nodes: int = 1
    strategy: str = "auto"  # auto, ddp (DDP is set up for us; launched by torchrun or SLURM across nodes)
    process_group_backend: str | None = None  # ddp: gloo (CPU) or nccl (GPU); None = Lightning's choice
    precision: str = "32-true"  # 16-mixed (loss scaling), bf16-mixed, 32-true
    max_epochs: int = 100
    max_steps: int = -1
    max_time: str | None = None  # "DD:HH:MM:SS": stop after this much training time
    val_check_interval: Any = 1.0  # float: fraction of an epoch; int: every N training batches
    check_val_every_n_epoch: int | None = 1
    limit_val_batches: float = 1.0
    gradient_clip_val: float = 5.0
    accumulate_grad_batches: int = 1
    log_every_n_steps: int = 20
    enable_progress_bar: bool = True
    num_sanity_val_steps: int = 0
    checkpoint_every_n_steps: int = 500
    early_stop_patience: int = 5  # validations without improvement of `monitor`; 0 disables
    # the metric that picks best.ckpt (and the bundle) and drives early stopping: val/loss or val/wer.
    # NOTE: a CTC model's validation loss often rises (over-confidence) while its WER still falls; the demo
    # monitors val/wer, since selecting by loss exported a step-2975 model at 46% dev WER over a 38% final one.
    monitor: str = "val/loss"

    def __post_init__(self) -> None:
        if self.monitor not in MONITORS:
            raise ValueError(f"trainer.monitor must be one of {', '.join(MONITORS)}, got {self.monitor!r}")

    deterministic: bool = False
    num_threads: int = (
        0  # torch intra-op threads; 0 = torch's default. NOTE: 1 on a CPU shared with other jobs
    )


@dataclass
class CostConfig:
    usd_per_device_hour: float = 0.0  # e.g. an H100 on demand; summary.json reports the run's cost


@dataclass
class TrainConfig:
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    run_dir: str = "runs/train"  # Hydra's output dir is set to it (conf/train.yaml)
    resume: str = "auto"  # auto: <run>/checkpoints/last.ckpt when present; never; or a checkpoint path
    seed: int = 0
    export_bundle: bool = True
    record_keys: bool = False  # debug: append every trained utterance key to <run>/keys-rank{R}.tsv


def register_configs() -> None:
    """Registers the structured schema that conf/train.yaml and the conf/ groups are checked against."""
    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)


# --- build_* -------------------------------------------------------------------------------------------


def build_datamodule(cfg: TrainConfig) -> ShardDataModule:
    return ShardDataModule(cfg.data, cfg.model.subsampling_factor)


def build_system(cfg: TrainConfig, dm: ShardDataModule, run_dir: Path) -> ASRSystem:
    """The model sized by the tokenizer and features of the data, with the data's CMVN inside."""
    model_cfg = ModelConfig.from_dict(
        {**asdict(cfg.model), "vocab_size": dm.tokenizer.vocab_size, "input_dim": dm.feature.dim}
    )
    system = ASRSystem(
        model_cfg, build_optim(cfg, dm), dm.tokenizer, str(run_dir) if cfg.record_keys else None
    )
    system.model.set_cmvn(dm.cmvn_mean, dm.cmvn_std)
    return system


def build_optim(cfg: TrainConfig, dm: ShardDataModule) -> OptimConfig:
    """The optimizer config with the run's total optimizer steps (cosine) or seconds (cosine_time) filled in."""
    if cfg.optim.schedule == "cosine_time" and cfg.optim.total_seconds <= 0 and cfg.trainer.max_time:
        return replace(cfg.optim, total_seconds=max_time_seconds(cfg.trainer.max_time))
    if cfg.optim.total_steps > 0:
        return cfg.optim
    t = cfg.trainer
    per_epoch = math.ceil(dm.steps_per_epoch(t.devices * t.num_nodes) / t.accumulate_grad_batches)
    total = t.max_steps if t.max_steps > 0 else t.max_epochs * per_epoch
    return replace(cfg.optim, total_steps=total)


def max_time_seconds(max_time: str) -> float:
    """Lightning's "DD:HH:MM:SS" -> seconds."""
    days, hours, minutes, seconds = (float(x) for x in max_time.split(":"))
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def build_callbacks(cfg: TrainConfig, run_dir: Path) -> list[L.Callback]:
    ckpt_dir = run_dir / CHECKPOINT_DIR
    callbacks: list[L.Callback] = [
        # every N steps (keeps the newest only) and last.ckpt, for resume
        ModelCheckpoint(
            ckpt_dir,
            "step{step:07d}",
            every_n_train_steps=cfg.trainer.checkpoint_every_n_steps,
            save_top_k=1,
            monitor="step",
            mode="max",
            save_last=True,
            auto_insert_metric_name=False,
        ),
        ModelCheckpoint(ckpt_dir, BEST_CHECKPOINT, monitor=cfg.trainer.monitor, mode="min", save_top_k=1),
        LearningRateMonitor(logging_interval="step"),
        RunStateRng(),
    ]
    if cfg.trainer.early_stop_patience > 0:
        callbacks.append(
            EarlyStopping(cfg.trainer.monitor, patience=cfg.trainer.early_stop_patience, mode="min")
        )
    return callbacks


def build_strategy(cfg: TrainerConfig) -> str | DDPStrategy:
    if cfg.strategy != "ddp":
        return cfg.strategy
    # NOTE: our only buffers (CMVN) are identical on all ranks, so no per-forward broadcast is needed;
    # newer torch renamed the option (the old name warns)
    ddp_params = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    no_sync = "forward_sync_buffers" if "forward_sync_buffers" in ddp_params else "broadcast_buffers"
    return DDPStrategy(process_group_backend=cfg.process_group_backend, **{no_sync: False})


def build_trainer(cfg: TrainConfig, run_dir: Path, callbacks: list[L.Callback]) -> L.Trainer:
    t = cfg.trainer
    return L.Trainer(
        accelerator=t.accelerator, devices=t.devices, num_nodes=t.num_nodes, strategy=build_strategy(t),
        precision=t.precision, max_epochs=t.max_epochs, max_steps=t.max_steps, max_time=t.max_time,
        val_check_interval=t.val_check_interval, check_val_every_n_epoch=t.check_val_every_n_epoch,
        limit_val_batches=t.limit_val_batches, gradient_clip_val=t.gradient_clip_val,
        accumulate_grad_batches=t.accumulate_grad_batches, log_every_n_steps=t.log_every_n_steps,
        enable_progress_bar=t.enable_progress_bar, num_sanity_val_steps=t.num_sanity_val_steps,
        deterministic=t.deterministic, callbacks=callbacks, default_root_dir=run_dir,
        logger=TensorBoardLogger(run_dir, name="tb", version="", default_hp_metric=False),
        use_distributed_sampler=False,  # NOTE: our IterableDataset splits shards by rank itself
    )  # fmt: skip


def resolve_resume(cfg: TrainConfig, run_dir: Path) -> str | None:
    """The checkpoint to continue from: resume=auto finds last.ckpt in the run dir."""
    if cfg.resume == "never":
        return None
    if cfg.resume == "auto":
        last = run_dir / CHECKPOINT_DIR / LAST_CHECKPOINT
        return str(last) if last.exists() else None
    return cfg.resume


# --- RNG state in checkpoints ------------------------------------------------------------------------------


class RunStateRng(L.Callback):
    """Saves Python/NumPy/torch RNG states in checkpoints and restores them on resume.

    NOTE: the checkpoint holds rank 0's states; other ranks derive theirs from it and their rank.
    """

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        checkpoint["rng"] = {
            "python": random.getstate(),
            "numpy": _numpy_state_to_plain(np.random.get_state()),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        }

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        rng = checkpoint.get("rng")
        if not rng:
            return
        random.setstate(rng["python"])
        np.random.set_state(_numpy_state_from_plain(rng["numpy"]))
        torch.set_rng_state(rng["torch"])
        if rng["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        if trainer.global_rank:
            torch.manual_seed(int(torch.randint(0, 2**31, (1,))) + trainer.global_rank)


def _numpy_state_to_plain(state: tuple) -> list:
    """NumPy's RNG state with its array as a tensor: Lightning loads checkpoints with weights_only=True."""
    name, keys, pos, has_gauss, cached = state
    return [name, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]


def _numpy_state_from_plain(state: list) -> tuple:
    name, keys, pos, has_gauss, cached = state
    return name, keys.numpy().astype(np.uint32), pos, has_gauss, cached


# --- summary and export ------------------------------------------------------------------------------------


def convergence_step(val_history: list[dict], tolerance: float = CONVERGENCE_TOLERANCE) -> int | None:
    """First step whose validation loss is within ``tolerance`` of the run's minimum."""
    if not val_history:
        return None
    best = min(v["loss"] for v in val_history)
    return next(v["step"] for v in val_history if v["loss"] <= best * (1 + tolerance))


def build_summary(cfg: TrainConfig, trainer: L.Trainer, system: ASRSystem, audio_seconds: float) -> dict:
    """The run's figures: steps, time, audio, throughput, best validation metrics, convergence, cost."""
    wall = system.fit_seconds()
    devices = trainer.world_size
    device_hours = wall * devices / SECONDS_PER_HOUR
    history = system.val_history
    return {
        "steps": trainer.global_step,
        "epochs": trainer.current_epoch,
        "wall_seconds": wall,
        "audio_hours_seen": audio_seconds / SECONDS_PER_HOUR,
        "throughput_audio_s_per_s": audio_seconds / max(wall, 1e-9),
        "best_val_loss": min((v["loss"] for v in history), default=None),
        "best_val_wer": min((v["wer"] for v in history), default=None),
        "best_val_cer": min((v["cer"] for v in history), default=None),
        "convergence_step": convergence_step(history),
        "world_size": devices,
        "device_hours": device_hours,
        "cost_usd": device_hours * cfg.cost.usd_per_device_hour,
        "precision": cfg.trainer.precision,
        "parameters": system.model.num_parameters(),
        "val_history": history,
    }


def total_audio_seconds(trainer: L.Trainer, system: ASRSystem) -> float:
    """Audio trained on by all ranks (a collective: call it on every rank)."""
    local = torch.tensor(system.audio_seconds, dtype=torch.float64, device=system.device)
    return float(trainer.strategy.reduce(local, reduce_op="sum"))


def export_bundle(
    run_dir: Path, system: ASRSystem, dm: ShardDataModule, summary: dict, monitor: str = "val/loss"
) -> Path:
    """bundle.pt from the best checkpoint's weights, or the final weights when they validated best (or none)."""
    best = run_dir / CHECKPOINT_DIR / f"{BEST_CHECKPOINT}.ckpt"
    history = system.val_history
    metric = monitor.removeprefix("val/")
    final_is_best = (
        bool(history)
        and history[-1]["step"] == system.global_step
        and history[-1][metric] <= min(h[metric] for h in history)
    )
    if best.exists() and not final_is_best:
        state = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
        system.load_state_dict(state)
    extra = {"summary": {k: v for k, v in summary.items() if k != "val_history"}, "run_dir": str(run_dir)}
    return save_bundle(run_dir / BUNDLE_FILE, system.model.cpu(), dm.feature, dm.tokenizer, extra=extra)


# --- entry point ----------------------------------------------------------------------------------------------


def fit(cfg: TrainConfig, run_dir: Path) -> tuple[L.Trainer, ASRSystem, ShardDataModule]:
    """Builds everything and fits (resuming as configured); returns the fitted pieces."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.trainer.num_threads > 0:
        torch.set_num_threads(cfg.trainer.num_threads)
    L.seed_everything(cfg.seed, workers=True)
    dm = build_datamodule(cfg)
    system = build_system(cfg, dm, run_dir)
    trainer = build_trainer(cfg, run_dir, build_callbacks(cfg, run_dir))
    trainer.fit(system, dm, ckpt_path=resolve_resume(cfg, run_dir))
    if system.val_history and system.val_history[-1]["step"] < trainer.global_step:
        # NOTE: a run stopped by max_time ends between validations, with its best (annealed) weights unseen
        trainer.validate(system, datamodule=dm, verbose=False)
    return trainer, system, dm


def report(
    cfg: TrainConfig, run_dir: Path, trainer: L.Trainer, system: ASRSystem, dm: ShardDataModule
) -> dict:
    """Writes summary.json and bundle.pt (rank 0); call on every rank (the audio total is a collective)."""
    summary = build_summary(cfg, trainer, system, total_audio_seconds(trainer, system))
    if trainer.is_global_zero:
        (run_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
        if cfg.export_bundle:
            export_bundle(run_dir, system, dm, summary, cfg.trainer.monitor)
        log.info("summary: %s", {k: v for k, v in summary.items() if k != "val_history"})
    return summary


def shutdown_distributed() -> None:
    """Waits for every rank, then closes the process group.

    NOTE: left to interpreter exit, gloo's threads can abort a rank ("terminate called without an active
    exception"), and torchrun's agents then wait on each other's exit barrier for minutes.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def train(cfg: TrainConfig, run_dir: Path) -> dict:
    """Fits a model as configured; returns the summary (also written to ``run_dir/summary.json``)."""
    trainer, system, dm = fit(cfg, run_dir)
    summary = report(cfg, run_dir, trainer, system, dm)
    shutdown_distributed()
    return summary


register_configs()


@hydra.main(config_path="../conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    schema: TrainConfig = OmegaConf.to_object(cfg)
    train(schema, Path(HydraConfig.get().runtime.output_dir))


if __name__ == "__main__":
    main()
