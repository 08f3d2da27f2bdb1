"""WebDataset training pipeline: a chain of small per-sample processors over spectrogram shards.

    shard list -> seeded shuffle -> split by rank/worker -> read tar -> parse meta -> filter
    -> shuffle buffer -> bucket by length -> dynamic batch (by frames) -> [skip on resume]
    -> decode feats -> tokenize -> SpecAugment -> pad

Each processor is a generator function over an iterable of sample dicts with keyword settings (WeNet style).
Batching decisions use only the metadata (``KEY.json``: ``num_frames``), so a resumed run fast-forwards
through batches without decoding features. Bad samples are skipped and counted by reason.
"""

from __future__ import annotations

import io
import json
import random
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import fsspec
import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from webdataset.tariterators import group_by_keys

from asr.audio import spec_augment
from asr.model import subsampled_lengths
from asr.tokenizer import Tokenizer

INDEX_FILE = "index.json"
CMVN_FILE = "cmvn.json"
SUPPORTED_INDEX_VERSION = 1
NPY_MAGIC_V1 = b"\x93NUMPY\x01"
NPY_PREFIX = 10  # magic (6), version (2), header length (2)
_NPY_SHAPE = re.compile(rb"'shape': \((\d+), (\d+)\)")
TAR_BLOCK = 512
TAR_EMPTY_BLOCK = bytes(TAR_BLOCK)
MIN_FRAMES_4X = 7  # ((7 - 1) // 2 - 1) // 2 = 1 output frame of the two stride-2 convs
SEED_STRIDE = 1_000_003  # mixes (seed, epoch, rank, worker) into distinct RNG seeds

Sample = dict
Batch = dict


@dataclass(frozen=True)
class PipelineOptions:
    """Settings of the per-sample processors (``DataConfig`` in the datamodule fills them)."""

    max_frames_per_batch: int = 20_000  # padded frames (batch size x longest utterance) per batch
    max_duration: float = 30.0  # seconds; longer utterances are dropped (counted)
    subsampling_factor: int = 4  # the model's: utterances with more tokens than output frames are dropped
    shuffle_buffer: int = 1_000  # samples; 0 disables sample shuffling
    sort_buffer: int = 500  # samples sorted by length together before batching (bucketing); 0 disables
    spec_augment: bool = False  # training only

    @property
    def min_frames(self) -> int:
        """Fewest feature frames that leave one output frame after the model's subsampling (7 at 4x, 14 at 8x)."""
        return MIN_FRAMES_4X * (self.subsampling_factor // 4)


# --- shard index ------------------------------------------------------------------------------------------


def read_json(url: str) -> dict:
    """Read a JSON file from a local path or any fsspec URL (s3://, gs://, ...)."""
    with fsspec.open(url, "rt", encoding="utf-8") as f:
        return json.load(f)


def read_index(shard_dir: str) -> dict:
    """``index.json`` of a shard directory, with each shard's ``url`` added."""
    index = read_json(f"{shard_dir.rstrip('/')}/{INDEX_FILE}")
    if index.get("format_version") != SUPPORTED_INDEX_VERSION:
        raise ValueError(f"{shard_dir}: unsupported index format_version {index.get('format_version')!r}")
    for shard in index["shards"]:
        shard["url"] = f"{shard_dir.rstrip('/')}/{shard['name']}"
    return index


def read_cmvn(shard_dir: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Global (mean [D], std [D]) from ``cmvn.json`` (per-dim count, sum, sum of squares)."""
    stats = read_json(f"{shard_dir.rstrip('/')}/{CMVN_FILE}")
    count = float(stats["count"])
    total = torch.tensor(stats["sum"], dtype=torch.float64)
    mean = total / count
    var = torch.tensor(stats["sum_sq"], dtype=torch.float64) / count - mean**2
    return mean.float(), var.clamp(min=0).sqrt().float()


def epoch_shards(shards: list[dict], epoch: int, seed: int, shuffle: bool = True) -> list[dict]:
    """The shard list in this epoch's order: a seeded shuffle, the same on every rank."""
    order = list(shards)
    if shuffle:
        random.Random(seed * SEED_STRIDE + epoch).shuffle(order)
    return order


def split_shards(shards: list[dict], rank: int, world_size: int, worker: int, num_workers: int) -> list[dict]:
    """The disjoint subset of ``shards`` read by one (rank, DataLoader worker)."""
    return shards[rank::world_size][worker::num_workers]


def rank_frames_upper_bound(shards: list[dict], world_size: int) -> int:
    """Most frames any rank can be dealt: the ceil(n / world) largest shards (any shuffle)."""
    per_rank = -(-len(shards) // world_size)
    return sum(sorted((s["frames"] for s in shards), reverse=True)[:per_rank])


# --- processors --------------------------------------------------------------------------------------------


def tar_members(f: BinaryIO) -> Iterator[dict]:
    """Regular files of a ustar/GNU tar stream as {"fname", "data"} (webdataset's member dicts).

    NOTE: a lean replacement for ``tarfile`` streaming, which costs more per member than decoding it: headers
    are checksummed, GNU long names and ustar prefixes are honoured, other member types are skipped.
    """
    long_name = None
    while len(header := f.read(TAR_BLOCK)) == TAR_BLOCK and header != TAR_EMPTY_BLOCK:
        if sum(header[:148]) + sum(header[156:]) + 8 * 32 != int(header[148:156].strip(b" \0") or b"0", 8):
            raise ValueError("bad tar header checksum")
        size = int(header[124:136].strip(b" \0") or b"0", 8)
        data = f.read(size + (-size % TAR_BLOCK))[:size]
        if len(data) < size:
            raise ValueError("truncated tar member")
        kind = header[156:157]
        if kind == b"L":
            long_name = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            continue
        if kind in (b"0", b"\0"):
            name = long_name or _tar_name(header)
            yield {"fname": name, "data": data}
        long_name = None


def _tar_name(header: bytes) -> str:
    name = header[:100].split(b"\0", 1)[0]
    prefix = header[345:500].split(b"\0", 1)[0] if header[257:262] == b"ustar" else b""
    return (prefix + b"/" + name if prefix else name).decode("utf-8", "surrogateescape")


def read_tars(urls: Iterable[str], drops: Counter) -> Iterator[Sample]:
    """Shard URLs -> raw samples {"__key__", "feats.npy": bytes, "txt": bytes, "json": bytes}."""
    for url in urls:
        try:
            with fsspec.open(url, "rb") as f:
                members = ({**m, "__url__": url} for m in tar_members(f))
                yield from group_by_keys(members)
        except (OSError, ValueError) as e:  # a missing or truncated shard: skip its remainder
            drops[f"unreadable shard: {type(e).__name__}"] += 1


def parse_meta(samples: Iterable[Sample], drops: Counter) -> Iterator[Sample]:
    """Adds "key", "num_frames", "duration", "text" from the small members; features stay undecoded."""
    for s in samples:
        try:
            meta = json.loads(s["json"])
            s.update(key=s["__key__"], num_frames=int(meta["num_frames"]), duration=float(meta["duration"]))
            s["text"] = s["txt"].decode("utf-8").strip()
            if "feats.npy" not in s:
                raise KeyError("feats.npy")
        except (KeyError, ValueError, UnicodeDecodeError) as e:
            drops[f"bad sample: {type(e).__name__}"] += 1
            continue
        yield s


def filter_length(
    samples: Iterable[Sample], drops: Counter, max_duration: float, min_frames: int
) -> Iterator:
    """Drops utterances over ``max_duration`` seconds, too short to subsample, or without text."""
    for s in samples:
        if s["duration"] > max_duration:
            drops["longer than max_duration"] += 1
        elif s["num_frames"] < min_frames:
            drops["too few frames"] += 1
        elif not s["text"]:
            drops["empty transcript"] += 1
        else:
            yield s


def shuffle_buffer(samples: Iterable[Sample], size: int, rng: random.Random) -> Iterator[Sample]:
    """Reservoir-style shuffle through a buffer of ``size`` samples (deterministic given ``rng``)."""
    if size <= 1:
        yield from samples
        return
    buf: list[Sample] = []
    for s in samples:
        buf.append(s)
        if len(buf) >= size:
            i = rng.randrange(len(buf))
            buf[i], buf[-1] = buf[-1], buf[i]
            yield buf.pop()
    rng.shuffle(buf)
    yield from buf


def dynamic_batches(samples: list[Sample], max_frames: int) -> list[list[Sample]]:
    """Greedy batches whose padded size (count x longest) stays within ``max_frames``.

    An utterance longer than ``max_frames`` on its own still forms a batch of one.
    """
    batches: list[list[Sample]] = []
    batch: list[Sample] = []
    longest = 0
    for s in samples:
        n = s["num_frames"]
        if batch and (len(batch) + 1) * max(longest, n) > max_frames:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(s)
        longest = max(longest, n)
    if batch:
        batches.append(batch)
    return batches


def bucket_batches(
    samples: Iterable[Sample], max_frames: int, sort_buffer: int, rng: random.Random
) -> Iterator[list[Sample]]:
    """Duration bucketing: sort ``sort_buffer`` samples by length, batch them, yield in random order."""
    if sort_buffer <= 0:
        buf: list[Sample] = []
        for s in samples:  # no sorting: batch in arrival order
            if buf and (len(buf) + 1) * max(max(x["num_frames"] for x in buf), s["num_frames"]) > max_frames:
                yield buf
                buf = []
            buf.append(s)
        if buf:
            yield buf
        return
    buf = []
    for s in samples:
        buf.append(s)
        if len(buf) >= sort_buffer:
            yield from _sorted_batches(buf, max_frames, rng)
            buf = []
    yield from _sorted_batches(buf, max_frames, rng)


def _sorted_batches(buf: list[Sample], max_frames: int, rng: random.Random) -> list[list[Sample]]:
    batches = dynamic_batches(sorted(buf, key=lambda s: s["num_frames"]), max_frames)
    rng.shuffle(batches)  # NOTE: otherwise every buffer would go from short to long utterances
    return batches


def read_npy(data: bytes) -> torch.Tensor:
    """A shard's ``.npy`` member -> [T, D] tensor of its dtype (float16).

    NOTE: a fast path for the format data_prep writes (v1 header, little-endian float16, C order): np.load
    parses the header with ``ast`` and costs ~15x more than the copy itself. Anything else goes to np.load.
    """
    header_end = NPY_PREFIX + int.from_bytes(data[8:10], "little")
    header = data[NPY_PREFIX:header_end]
    shape = _NPY_SHAPE.search(header)
    if data[:7] == NPY_MAGIC_V1 and b"'<f2'" in header and b"False" in header and shape:
        frames, dims = int(shape[1]), int(shape[2])
        flat = torch.frombuffer(bytearray(data), dtype=torch.float16, offset=header_end, count=frames * dims)
        return flat.view(frames, dims)
    return torch.from_numpy(np.load(io.BytesIO(data), allow_pickle=False))


def decode_sample(
    s: Sample, tokenizer: Tokenizer, augment: bool, drops: Counter, subsampling_factor: int = 4
) -> Sample | None:
    """Decodes features [T, D] (float16 -> float32) and tokenizes; None when CTC could not align it."""
    try:
        feats = read_npy(s["feats.npy"]).float()  # NOTE: float16 arithmetic on a CPU is slow
    except (ValueError, OSError, RuntimeError) as e:
        drops[f"bad features: {type(e).__name__}"] += 1
        return None
    tokens = tokenizer.encode(s["text"])
    if feats.ndim != 2 or len(tokens) > subsampled_lengths(feats.shape[0], subsampling_factor):
        drops["more tokens than output frames"] += 1
        return None
    if augment:
        feats = spec_augment(feats)
    return {"key": s["key"], "feats": feats, "tokens": tokens, "text": s["text"], "duration": s["duration"]}


def collate(samples: list[Sample]) -> Batch:
    """Pads decoded samples: feats [B, T, D] float32, feat_lens [B], targets [B, S], target_lens [B]."""
    feats = pad_sequence([s["feats"] for s in samples], batch_first=True)  # zero padding
    targets = pad_sequence([torch.tensor(s["tokens"]) for s in samples], batch_first=True)  # blank padding
    feat_lens = torch.tensor([s["feats"].shape[0] for s in samples])
    target_lens = torch.tensor([len(s["tokens"]) for s in samples])
    return {
        "feats": feats,
        "feat_lens": feat_lens,
        "targets": targets,
        "target_lens": target_lens,
        "keys": [s["key"] for s in samples],
        "texts": [s["text"] for s in samples],
        "audio_seconds": float(sum(s["duration"] for s in samples)),
    }


def padding_efficiency(feat_lens: torch.Tensor) -> float:
    """Real frames / padded frames of a batch with these lengths [B]."""
    return float(feat_lens.sum()) / float(feat_lens.numel() * feat_lens.max())


# --- the stream -------------------------------------------------------------------------------------------


@dataclass
class StreamPosition:
    """Where one (rank, worker) stream starts: which epoch, which pass, how many batches to skip."""

    epoch: int = 0
    skip_batches: int = 0
    wrap: int = 0  # 0: the epoch's real pass; k > 0: the k-th wrap-around pass that pads a short rank


class ShardStream(torch.utils.data.IterableDataset):
    """Batches from the shards this (rank, worker) owns; deterministic given (seed, epoch, rank, worker).

    Each yielded batch carries ``worker`` (its DataLoader worker id), ``drops`` (samples skipped since the
    previous batch, by reason) and ``wrap`` (0 in the epoch's real pass).
    """

    def __init__(
        self,
        shards: list[dict],
        tokenizer: Tokenizer,
        options: PipelineOptions,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ):
        super().__init__()
        self.shards, self.tokenizer, self.options = shards, tokenizer, options
        self.seed, self.shuffle, self.rank, self.world_size = seed, shuffle, rank, world_size
        self.positions: dict[int, StreamPosition] = {}  # worker id -> position; set before each iter()

    def __getstate__(self) -> dict:
        """Picklable for loader workers started by a forkserver: the tokenizer travels as its model bytes."""
        return {**self.__dict__, "tokenizer": self.tokenizer.proto}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update({**state, "tokenizer": Tokenizer(state["tokenizer"])})

    def worker_shards(self, epoch: int, worker: int, num_workers: int, wrap: int = 0) -> list[dict]:
        """The shards one worker reads in ``epoch`` (a wrap pass rereads them in a new order)."""
        mine = split_shards(
            epoch_shards(self.shards, epoch, self.seed, self.shuffle),
            self.rank,
            self.world_size,
            worker,
            num_workers,
        )
        if wrap:
            random.Random(self._seed(epoch, worker, wrap)).shuffle(mine)
        return mine

    def __iter__(self) -> Iterator[Batch]:
        info = torch.utils.data.get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        pos = self.positions.get(worker, StreamPosition())
        yield from self.batches(pos, worker, num_workers)

    def batches(self, pos: StreamPosition, worker: int = 0, num_workers: int = 1) -> Iterator[Batch]:
        """The batch stream of one worker from ``pos``; skipped batches are never decoded."""
        opt, drops = self.options, Counter()
        rng = random.Random(self._seed(pos.epoch, worker, pos.wrap))
        urls = [s["url"] for s in self.worker_shards(pos.epoch, worker, num_workers, pos.wrap)]
        samples = parse_meta(read_tars(urls, drops), drops)
        samples = filter_length(samples, drops, opt.max_duration, opt.min_frames)
        samples = shuffle_buffer(samples, opt.shuffle_buffer if self.shuffle else 0, rng)
        for i, raw in enumerate(bucket_batches(samples, opt.max_frames_per_batch, opt.sort_buffer, rng)):
            if i < pos.skip_batches:
                continue
            decoded = [
                decode_sample(s, self.tokenizer, opt.spec_augment, drops, opt.subsampling_factor) for s in raw
            ]
            decoded = [s for s in decoded if s is not None]
            batch = collate(decoded) if decoded else None
            if batch is None:  # every sample failed: an empty batch keeps the batch count deterministic
                batch = {"keys": [], "audio_seconds": 0.0}
            batch.update(epoch=pos.epoch, worker=worker, wrap=pos.wrap, drops=dict(drops))
            drops.clear()
            yield batch

    def _seed(self, epoch: int, worker: int, wrap: int) -> int:
        return (
            ((self.seed * SEED_STRIDE + epoch) * SEED_STRIDE + self.rank) * SEED_STRIDE + worker
        ) * 64 + wrap


def is_empty(batch: Batch) -> bool:
    """A batch whose samples were all dropped at decode time (it has no tensors)."""
    return "feats" not in batch
