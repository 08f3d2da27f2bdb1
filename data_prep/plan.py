"""The shard plan: which utterances go into which shard, computed up front from the manifest alone.

Shards are bounded by an estimate of their size (frames x dims x 2 bytes + per-sample overhead) or by an
utterance count. Durations come from the manifest (``duration``, or ``end - start``) or a cheap
``soundfile.info`` header probe. The plan depends only on the manifest and the config, never on the number of
workers or the order in which shards finish, which is what makes output byte-identical across runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import soundfile as sf

from asr.audio import FeatureConfig, num_frames
from data_prep import storage
from data_prep.shards import Record, ShardSpec, reject_entry, sample_key

BYTES_PER_VALUE = 2  # float16
SAMPLE_OVERHEAD_BYTES = 6 * 512 + 1024  # three tar headers + padding, npy header, metadata json
NAME_TEMPLATE = "{split}-{index:06d}.tar"


def probe_duration(record: Record) -> float:
    """Seconds of audio the record covers, without decoding it; 0.0 when unknown (the writer rejects it)."""
    if record.get("duration") is not None:
        return float(record["duration"])
    start, end = record.get("start") or 0.0, record.get("end")
    if end is not None:
        return max(0.0, end - start)
    try:
        src = storage.open_input(record["audio"])
        try:
            info = sf.info(src)
        finally:
            if not isinstance(src, str):
                src.close()
        return max(0.0, info.frames / info.samplerate - start)
    except Exception:  # noqa: BLE001 - any unreadable file only means "size unknown" here
        return 0.0


def estimate_bytes(seconds: float, cfg: FeatureConfig) -> int:
    frames = num_frames(int(seconds * cfg.sample_rate), cfg)
    return frames * cfg.dim * BYTES_PER_VALUE + SAMPLE_OVERHEAD_BYTES


def plan_shards(
    records: Iterable[Record],
    out_dir: str,
    split: str,
    feature: FeatureConfig,
    max_shard_utterances: int | None,
    max_shard_bytes: int | None,
    min_duration: float,
    max_duration: float,
) -> Iterator[ShardSpec]:
    """Stream records into shard specs; a record whose key was already seen is a ``duplicate_id`` reject."""
    seen: set[str] = set()
    batch: list[Record] = []
    rejected: list[dict] = []
    size = 0
    index = 0
    seconds = 0.0

    def emit() -> ShardSpec:
        return ShardSpec(
            index=index,
            name=NAME_TEMPLATE.format(split=split, index=index),
            out_dir=out_dir,
            feature=feature.to_dict(),
            utterances=tuple(batch),
            min_duration=min_duration,
            max_duration=max_duration,
            rejected=tuple(rejected),
            planned_seconds=seconds,
        )

    for record in records:
        key = sample_key(record["id"])
        if key in seen:
            rejected.append(reject_entry(record, "duplicate_id"))
            continue
        seen.add(key)
        duration = probe_duration(record)
        est = estimate_bytes(duration, feature)
        full_count = max_shard_utterances is not None and len(batch) >= max_shard_utterances
        full_bytes = max_shard_bytes is not None and size + est > max_shard_bytes
        if batch and (full_count or full_bytes):
            yield emit()
            index, batch, rejected, size, seconds = index + 1, [], [], 0, 0.0
        batch.append(record)
        size += est
        seconds += duration
    if batch or rejected:
        yield emit()
