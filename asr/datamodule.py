"""LightningDataModule over shard directories, and the resumable train loader Lightning checkpoints.

Every rank runs the same number of steps per epoch (``steps_per_epoch``, from ``index.json`` totals), so
DDP never hangs on uneven shards: a rank whose shards run out first wraps around its own shards (those
batches are marked ``wrap > 0``), a rank with more batches stops at the epoch length (the rest is counted).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
from dataclasses import dataclass

import lightning as L
import torch
from omegaconf import MISSING
from torch.utils.data import DataLoader

from asr.audio import FeatureConfig
from asr.data import (
    PipelineOptions,
    ShardStream,
    StreamPosition,
    rank_frames_upper_bound,
    read_cmvn,
    read_index,
)
from asr.tokenizer import Tokenizer

log = logging.getLogger(__name__)

STATE_VERSION = 1


@dataclass
class DataConfig:
    train_dir: str = MISSING  # shard directory (local path or fsspec URL) with index.json and cmvn.json
    val_dir: str = MISSING
    tokenizer: str = MISSING  # sentencepiece .model (data_prep.tokenizer)
    max_frames_per_batch: int = 20_000  # padded frames per batch (memory bound), not utterances
    max_duration: float = 30.0  # seconds; longer utterances are dropped and counted
    shuffle_buffer: int = 1_000  # samples
    sort_buffer: int = 500  # samples sorted by length before batching (duration bucketing); 0 = off
    spec_augment: bool = True
    num_workers: int = 1  # DataLoader worker processes per rank (0 = in the main process)
    seed: int = 0  # shard and sample shuffling
    steps_per_epoch: int = 0  # 0: estimated from index.json frames (see batch_fill_estimate)
    batch_fill_estimate: float = 0.8  # expected real frames / max_frames_per_batch, for the estimate


def worker_context(num_workers: int):
    """Loader workers start from a clean forkserver (with our modules preloaded), not a fork of the trainer.

    NOTE: forking a process whose threads (OpenMP, gloo, loggers) may hold locks can deadlock the child;
    we saw a worker hang on a futex that way. The server is started once; workers then start in milliseconds.
    """
    if num_workers == 0:
        return None
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["asr.data"])
    return ctx


def estimate_steps_per_epoch(shards: list[dict], world_size: int, max_frames: int, fill: float) -> int:
    """Batches per rank per epoch: the fullest rank's frames over the expected frames per batch."""
    return max(1, math.ceil(rank_frames_upper_bound(shards, world_size) / (max_frames * fill)))


class ResumableLoader(DataLoader):
    """Train loader with a fixed length and ``state_dict``/``load_state_dict`` (saved in Lightning checkpoints).

    Each ``iter()`` is one epoch of exactly ``len(self)`` batches. The state records the epoch and how many
    batches each worker delivered; on restore every worker's stream skips that many batches (metadata only).
    NOTE: Lightning does not prefetch from a loader with a length, so the state counts exactly the batches
    the training loop has taken.
    """

    def __init__(self, stream: ShardStream, steps_per_epoch: int, num_workers: int = 0):
        super().__init__(
            stream,
            batch_size=None,
            num_workers=num_workers,
            persistent_workers=False,
            multiprocessing_context=worker_context(num_workers),
        )
        self.steps_per_epoch = steps_per_epoch
        self._next_epoch = 0
        self._resume: dict | None = None
        self._state = self._fresh_state(0)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self):
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        resume, self._resume = self._resume, None
        self._state = resume if resume and resume["epoch"] == epoch else self._fresh_state(epoch)
        return self._epoch_batches(self._state)

    def state_dict(self) -> dict:
        """Position in the epoch: {"version", "epoch", "yielded", "wrap", "per_worker"}."""
        return {**self._state, "per_worker": list(self._state["per_worker"])}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state`` at the next ``iter()``: the rest of that epoch, or the next epoch."""
        if state.get("version") != STATE_VERSION or len(state["per_worker"]) != self._num_streams:
            raise ValueError(f"loader state {state} does not match this loader ({self._num_streams} workers)")
        if state["yielded"] >= self.steps_per_epoch:
            self._next_epoch, self._resume = state["epoch"] + 1, None
        else:
            self._next_epoch, self._resume = (
                state["epoch"],
                {**state, "per_worker": list(state["per_worker"])},
            )

    @property
    def _num_streams(self) -> int:
        return max(1, self.num_workers)

    def _fresh_state(self, epoch: int) -> dict:
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "yielded": 0,
            "wrap": 0,
            "per_worker": [0] * self._num_streams,
        }

    def _warn_if_cut(self, state: dict, batches) -> None:
        """Before the epoch's last batch: warns when the real pass had more (they wait for the next epoch)."""
        if state["wrap"] == 0 and next(batches, None) is not None:
            log.warning(
                "epoch %d ended before this rank read all its shards: raise data.steps_per_epoch (now %d) "
                "or lower data.batch_fill_estimate",
                state["epoch"],
                self.steps_per_epoch,
            )

    def _epoch_batches(self, state: dict):
        """Exactly ``steps_per_epoch - state["yielded"]`` batches: the real pass, then wrap passes if short."""
        while state["yielded"] < self.steps_per_epoch:
            self.dataset.positions = {
                w: StreamPosition(state["epoch"], skip, state["wrap"])
                for w, skip in enumerate(state["per_worker"])
            }
            got = 0
            batches = super().__iter__()
            for batch in batches:
                state["per_worker"][batch["worker"]] += 1
                state["yielded"] += 1
                got += 1
                if state["yielded"] >= self.steps_per_epoch:
                    self._warn_if_cut(state, batches)
                    yield batch
                    return
                yield batch
            if got == 0 and state["wrap"] > 0:
                raise RuntimeError(
                    "this rank's shards yield no batches; check the shard directory and filters"
                )
            state["wrap"] += 1
            state["per_worker"] = [0] * self._num_streams


class ShardDataModule(L.LightningDataModule):
    """Train/val loaders over shard directories; exposes the tokenizer, feature config and CMVN stats."""

    def __init__(self, cfg: DataConfig, subsampling_factor: int = 4):
        super().__init__()
        self.cfg = cfg
        self.subsampling_factor = subsampling_factor  # the model's; drops utterances CTC cannot align
        self.tokenizer = Tokenizer(cfg.tokenizer)
        self.train_index = read_index(cfg.train_dir)
        self.val_index = read_index(cfg.val_dir)
        self.feature = FeatureConfig.from_dict(self.train_index["feature"])
        self.cmvn_mean, self.cmvn_std = read_cmvn(cfg.train_dir)  # [D], [D]

    def _rank_world(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def steps_per_epoch(self, world_size: int) -> int:
        """Batches every rank runs per epoch (the configured value, or estimated from index.json)."""
        if self.cfg.steps_per_epoch > 0:
            return self.cfg.steps_per_epoch
        c = self.cfg
        return estimate_steps_per_epoch(
            self.train_index["shards"], world_size, c.max_frames_per_batch, c.batch_fill_estimate
        )

    def _options(self, train: bool) -> PipelineOptions:
        c = self.cfg
        return PipelineOptions(
            max_frames_per_batch=c.max_frames_per_batch,
            max_duration=c.max_duration,
            shuffle_buffer=c.shuffle_buffer if train else 0,
            sort_buffer=c.sort_buffer,
            spec_augment=c.spec_augment and train,
            subsampling_factor=self.subsampling_factor,
        )

    def train_dataloader(self) -> ResumableLoader:
        rank, world = self._rank_world()
        shards = self.train_index["shards"]
        if len(shards) < world:
            raise ValueError(f"{len(shards)} train shards cannot feed {world} ranks; reshard smaller")
        stream = ShardStream(shards, self.tokenizer, self._options(True), self.cfg.seed, True, rank, world)
        loader = ResumableLoader(stream, self.steps_per_epoch(world), self.cfg.num_workers)
        log.info("rank %d/%d: %d shards, %d steps per epoch", rank, world, len(shards), len(loader))
        return loader

    def val_dataloader(self) -> DataLoader:
        rank, world = self._rank_world()
        stream = ShardStream(
            self.val_index["shards"], self.tokenizer, self._options(False), 0, False, rank, world
        )
        workers = min(1, self.cfg.num_workers)
        return DataLoader(
            stream, batch_size=None, num_workers=workers, multiprocessing_context=worker_context(workers)
        )


def batch_to_device(batch: dict, device: torch.device) -> dict:
    """Moves the tensors of a batch to ``device`` (lists and numbers stay)."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
