"""Data pipeline: dynamic batching and bucketing, disjoint rank/worker shards, exact resume, equal steps per rank."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest
import torch

from asr.data import (
    PipelineOptions,
    ShardStream,
    StreamPosition,
    bucket_batches,
    dynamic_batches,
    read_cmvn,
    read_index,
    split_shards,
)
from asr.datamodule import DataConfig, ResumableLoader, ShardDataModule
from asr.tokenizer import Tokenizer

MAX_FRAMES = 1_500  # a few espeak utterances per batch


@pytest.fixture(scope="module")
def train_index(tiny_shards):
    return read_index(str(tiny_shards["train"]))


@pytest.fixture(scope="module")
def tokenizer(tiny_shards):
    return Tokenizer(tiny_shards["tokenizer"])


@pytest.fixture(scope="module")
def train_keys(train_index):
    return Counter(k for s in train_index["shards"] for k in _shard_keys(s["url"]))


def _shard_keys(url: str) -> list[str]:
    import tarfile

    with tarfile.open(url) as tar:
        return sorted({m.name.split(".")[0] for m in tar.getmembers()})


def _stream(index, tokenizer, rank=0, world=1, seed=0, **opts):
    options = PipelineOptions(max_frames_per_batch=MAX_FRAMES, shuffle_buffer=8, sort_buffer=8, **opts)
    return ShardStream(index["shards"], tokenizer, options, seed=seed, rank=rank, world_size=world)


def _keys(batches) -> list[str]:
    return [k for b in batches for k in b["keys"]]


def _fake(lengths):
    return [{"num_frames": n, "key": str(i)} for i, n in enumerate(lengths)]


def test_dynamic_batches_stay_within_the_frame_budget():
    lengths = [random.Random(i).randint(50, 900) for i in range(300)] + [2_000]  # one over the budget
    batches = dynamic_batches(_fake(lengths), max_frames=1_000)
    assert sorted(s["key"] for b in batches for s in b) == sorted(str(i) for i in range(301))
    for b in batches:
        assert len(b) == 1 or len(b) * max(s["num_frames"] for s in b) <= 1_000


def test_bucketing_raises_padding_efficiency():
    rng = random.Random(0)
    samples = _fake([rng.randint(100, 1_500) for _ in range(2_000)])

    def efficiency(batches):
        real = sum(s["num_frames"] for b in batches for s in b)
        return real / sum(len(b) * max(s["num_frames"] for s in b) for b in batches)

    unsorted = efficiency(list(bucket_batches(samples, 20_000, 0, random.Random(0))))
    bucketed = efficiency(list(bucket_batches(samples, 20_000, 500, random.Random(0))))
    assert bucketed >= 0.95 > unsorted


def test_one_epoch_yields_every_utterance_once_as_padded_batches(train_index, tokenizer, train_keys):
    batches = list(_stream(train_index, tokenizer).batches(StreamPosition(epoch=0)))
    assert Counter(_keys(batches)) == train_keys
    for b in batches:
        n, t, d = b["feats"].shape
        assert d == 80 and t == int(b["feat_lens"].max()) and b["feats"].dtype == torch.float32
        assert b["targets"].shape == (n, int(b["target_lens"].max()))
        assert all(
            tokenizer.decode(b["targets"][i, : b["target_lens"][i]].tolist()) == b["texts"][i]
            for i in range(n)
        )
    assert len(batches) > 2


def test_epochs_reshuffle_deterministically(train_index, tokenizer):
    stream = _stream(train_index, tokenizer)
    first = _keys(stream.batches(StreamPosition(epoch=0)))
    assert first == _keys(stream.batches(StreamPosition(epoch=0)))
    assert first != _keys(stream.batches(StreamPosition(epoch=1)))


@pytest.mark.parametrize("world", [2, 3])  # 4 shards: divisible, and not
def test_ranks_and_workers_read_disjoint_shards(train_index, tokenizer, train_keys, world):
    per_rank = [
        _keys(_stream(train_index, tokenizer, r, world).batches(StreamPosition())) for r in range(world)
    ]
    assert Counter(k for keys in per_rank for k in keys) == train_keys  # disjoint and complete
    shards = train_index["shards"]
    seen = [s["name"] for r in range(world) for w in range(2) for s in split_shards(shards, r, world, w, 2)]
    assert sorted(seen) == sorted(s["name"] for s in shards)


def test_long_utterances_are_dropped_and_counted(train_index, tokenizer):
    batches = list(_stream(train_index, tokenizer, max_duration=2.5).batches(StreamPosition()))
    dropped = sum(b["drops"].get("longer than max_duration", 0) for b in batches)
    kept = len(_keys(batches))
    assert dropped > 0 and kept + dropped == train_index["utterances"]


def test_cmvn_matches_the_shard_statistics(tiny_shards):
    mean, std = read_cmvn(str(tiny_shards["train"]))
    stats = json.loads((tiny_shards["train"] / "cmvn.json").read_text())
    assert mean.shape == std.shape == (len(stats["sum"]),)
    assert torch.allclose(mean, torch.tensor(stats["sum"]) / stats["count"], rtol=1e-4)
    assert bool((std > 0).all())


@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_loader_yields_exactly_the_rest_of_the_epoch(train_index, tokenizer, train_keys, workers):
    def loader():
        return ResumableLoader(_stream(train_index, tokenizer), steps_per_epoch=8, num_workers=workers)

    def tagged(batches):
        return [(k, b["wrap"]) for b in batches for k in b["keys"]]

    full = loader()
    _ = list(iter(full))  # epoch 0
    reference = tagged(iter(full))  # epoch 1, uninterrupted
    killed = loader()
    killed.load_state_dict({**killed.state_dict(), "epoch": 1})  # start at epoch 1
    it = iter(killed)
    seen = tagged(next(it) for _ in range(3))
    state = json.loads(json.dumps(killed.state_dict()))  # survives serialization into a checkpoint
    resumed = loader()
    resumed.load_state_dict(state)
    rest = tagged(iter(resumed))
    assert Counter(seen + rest) == Counter(reference)
    assert Counter(k for k, wrap in seen + rest if wrap == 0) == train_keys  # none repeated, none skipped
    assert resumed.state_dict()["yielded"] == len(resumed) == 8


def test_every_rank_runs_the_same_number_of_steps(tiny_shards, train_keys):
    # 4 shards over 3 ranks: one rank holds 2 shards, the others 1 and pad by wrapping their own shards
    cfg = DataConfig(
        train_dir=str(tiny_shards["train"]),
        val_dir=str(tiny_shards["dev"]),
        tokenizer=str(tiny_shards["tokenizer"]),
        max_frames_per_batch=MAX_FRAMES,
        shuffle_buffer=4,
        sort_buffer=4,
        num_workers=0,
    )
    dm = ShardDataModule(cfg)
    steps = dm.steps_per_epoch(world_size=3)
    counts, real = [], Counter()
    for rank in range(3):
        stream = _stream(dm.train_index, dm.tokenizer, rank, 3)
        batches = list(iter(ResumableLoader(stream, steps)))
        counts.append(len(batches))
        real.update(k for b in batches if b["wrap"] == 0 for k in b["keys"])
    assert counts == [steps] * 3
    assert real == train_keys  # the real pass of every rank together: each utterance once


def test_shards_stream_from_an_fsspec_url(tiny_shards, tokenizer, train_keys):
    import fsspec

    fs = fsspec.filesystem("memory")
    for path in tiny_shards["train"].iterdir():
        fs.pipe(f"/shards/train/{path.name}", path.read_bytes())
    index = read_index("memory://shards/train")
    assert index["shards"][0]["url"].startswith("memory://")
    batches = _stream(index, tokenizer).batches(StreamPosition())
    assert Counter(_keys(batches)) == train_keys
    assert read_cmvn("memory://shards/train")[0].shape == (80,)
