"""Shard a corpus into spectrogram WebDataset tars: ``shard_manifest()`` and ``python -m data_prep.shard``.

    python -m data_prep.shard manifest=data/train.jsonl out_dir=shards/train workers=2
    python -m data_prep.shard manifest=LibriSpeech/train-clean-100 out_dir=s3://bucket/ls split=train \\
        executor=dask executor.address=tcp://10.0.0.5:8786

Writes ``OUT/{split}-{index:06d}.tar``, ``index.json``, ``cmvn.json``, ``rejects.jsonl`` and ``summary.json``.
A rerun of the same job skips complete shards and ends with byte-identical output.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from asr.audio import FBANK_16K, SPECTROGRAM_8K, FeatureConfig
from data_prep import storage
from data_prep.executor import DaskExecutorConfig, ExecutorConfig, LocalExecutorConfig, build_executor
from data_prep.manifests import read_manifest
from data_prep.plan import plan_shards
from data_prep.progress import Progress
from data_prep.shards import FORMAT_VERSION, ShardResult, ShardSpec, load_result, write_shard

MIN_DURATION = 0.1  # seconds
MAX_DURATION = 60.0  # seconds
MAX_SHARD_BYTES = 1_000_000_000
MAX_REJECT_FRACTION = 0.1
TOP_REASONS = 3  # reasons named when the job fails for too many rejects
INDEX, CMVN, REJECTS, SUMMARY = "index.json", "cmvn.json", "rejects.jsonl", "summary.json"


class TooManyRejects(RuntimeError):
    """More than ``max_reject_fraction`` of the utterances were rejected."""


def shard_manifest(
    manifest: str | Path,
    out_dir: str | Path,
    split: str = "train",
    workers: int = 1,
    feature: FeatureConfig | dict = FBANK_16K,
    max_shard_utterances: int | None = None,
    max_shard_bytes: int | None = MAX_SHARD_BYTES,
    *,
    manifest_format: str = "auto",
    min_duration: float = MIN_DURATION,
    max_duration: float = MAX_DURATION,
    max_reject_fraction: float = MAX_REJECT_FRACTION,
    executor: ExecutorConfig | None = None,
    progress: bool = True,
) -> dict:
    """Shard ``manifest`` (JSONL, LibriSpeech dir, Kaldi dir or Common Voice TSV) into ``out_dir``.

    Returns the summary (utterances, hours, shards, rejects, wall_seconds, audio_hours_per_second, out_dir).
    Raises ``TooManyRejects`` when rejects exceed ``max_reject_fraction``: rejects.jsonl and summary.json are
    written, index.json is not (its presence means the split is complete and usable).
    """
    feature = feature if isinstance(feature, FeatureConfig) else FeatureConfig.from_dict(feature)
    out = str(out_dir)
    storage.make_dirs(out)
    storage.remove_stale_temps(out)
    storage.remove(storage.join(out, INDEX))  # NOTE: a stale index must not describe shards being rewritten
    records = read_manifest(manifest, manifest_format)
    specs = list(
        plan_shards(
            records, out, split, feature, max_shard_utterances, max_shard_bytes, min_duration, max_duration
        )
    )
    results, timing = run_specs(specs, workers, executor, progress)
    summary = write_reports(results, out, timing)
    check_rejects(summary, max_reject_fraction, out)
    write_index(results, out, split, feature)
    return summary


def run_specs(
    specs: list[ShardSpec], workers: int, executor: ExecutorConfig | None, progress: bool
) -> tuple[list[ShardResult], dict]:
    """Write every shard not already complete; returns (results in plan order, progress summary)."""
    total = sum(len(s.utterances) + len(s.rejected) for s in specs)
    bar = Progress(total, sum(s.planned_seconds for s in specs) / 3600.0, enabled=progress)
    by_index: dict[int, ShardResult] = {}
    todo = []
    for spec in specs:
        done = load_result(spec)
        if done is None:
            todo.append(spec)
        else:
            by_index[spec.index] = done
            bar.update(done)
    if todo:
        pool = build_executor(executor, min(workers, len(todo)))
        try:
            for result in pool.map_unordered(write_shard, todo):
                by_index[result.index] = result
                bar.update(result)
        finally:
            pool.close()
    return [by_index[s.index] for s in specs], bar.close()


def write_reports(results: list[ShardResult], out: str, timing: dict) -> dict:
    """rejects.jsonl (plan order) and summary.json; returns the summary."""
    rejects = [r for res in results for r in res.rejects]
    lines = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rejects)
    storage.write_bytes(storage.join(out, REJECTS), lines.encode())
    summary = {**timing, "out_dir": out, "reject_reasons": dict(Counter(r["reason"] for r in rejects))}
    storage.write_bytes(storage.join(out, SUMMARY), _json(summary))
    return summary


def write_index(results: list[ShardResult], out: str, split: str, feature: FeatureConfig) -> None:
    """cmvn.json, then index.json (deterministic, plan order): written last, it marks the split complete."""
    storage.write_bytes(storage.join(out, CMVN), _json(cmvn_stats(results, feature.dim)))
    index = {
        "format_version": FORMAT_VERSION,
        "split": split,
        "feature": feature.to_dict(),
        "utterances": sum(r.utterances for r in results),
        "frames": sum(r.frames for r in results),
        "hours": sum(r.seconds for r in results) / 3600.0,
        "shards": [r.index_row() for r in results],
    }
    storage.write_bytes(storage.join(out, INDEX), _json(index))


def cmvn_stats(results: list[ShardResult], dim: int) -> dict:
    """Per-dim frame count, sum and sum of squares, summed over shards in plan order (deterministic)."""
    total, total_sq = [0.0] * dim, [0.0] * dim
    for r in results:
        if r.utterances:
            total = [a + b for a, b in zip(total, r.cmvn_sum, strict=True)]
            total_sq = [a + b for a, b in zip(total_sq, r.cmvn_sum_sq, strict=True)]
    return {"count": sum(r.frames for r in results), "sum": total, "sum_sq": total_sq}


def check_rejects(summary: dict, max_fraction: float, out: str) -> None:
    seen = summary["utterances"] + summary["rejects"]
    if seen and summary["rejects"] / seen > max_fraction:
        worst = sorted(summary["reject_reasons"].items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_REASONS]
        reasons = ", ".join(f"{reason} ({n})" for reason, n in worst)
        raise TooManyRejects(
            f"{summary['rejects']} of {seen} utterances rejected (> max_reject_fraction {max_fraction}); "
            f"top reasons: {reasons}; see {storage.join(out, REJECTS)}"
        )


def _json(obj: dict) -> bytes:
    return (json.dumps(obj, indent=1, sort_keys=True) + "\n").encode()


# --- Hydra entry point ---------------------------------------------------------------------------------


@dataclass
class FeatureConf:
    """Mirrors asr.audio.FeatureConfig; presets are the ``feature`` group (fbank_16k, spectrogram_8k)."""

    kind: str = FBANK_16K.kind
    sample_rate: int = FBANK_16K.sample_rate
    num_mel_bins: int = FBANK_16K.num_mel_bins
    window_ms: float = FBANK_16K.window_ms
    hop_ms: float = FBANK_16K.hop_ms


@dataclass
class ShardJobConfig:
    manifest: str = MISSING  # JSONL file, LibriSpeech dir, Kaldi data dir or Common Voice .tsv
    out_dir: str = MISSING  # local dir or fsspec URL (s3://bucket/prefix)
    split: str = "train"
    manifest_format: str = "auto"  # auto | jsonl | librispeech | kaldi | commonvoice
    workers: int = 1
    max_shard_utterances: int | None = None
    max_shard_bytes: int | None = MAX_SHARD_BYTES
    min_duration: float = MIN_DURATION
    max_duration: float = MAX_DURATION
    max_reject_fraction: float = MAX_REJECT_FRACTION
    progress: bool = True
    feature: FeatureConf = field(default_factory=FeatureConf)
    executor: Any = MISSING  # group: local | dask


def register_configs() -> None:
    cs = ConfigStore.instance()
    cs.store(name="shard_schema", node=ShardJobConfig)
    cs.store(group="executor", name="local", node=LocalExecutorConfig)
    cs.store(group="executor", name="dask", node=DaskExecutorConfig)
    cs.store(group="feature", name="fbank_16k", node=FeatureConf())
    spec8k = FeatureConf(**{k: getattr(SPECTROGRAM_8K, k) for k in FeatureConf.__dataclass_fields__})
    cs.store(group="feature", name="spectrogram_8k", node=spec8k)


def build_executor_config(cfg: Any) -> ExecutorConfig:
    return OmegaConf.to_object(cfg)


@hydra.main(version_base=None, config_path="../conf/prep", config_name="shard")
def main(cfg: ShardJobConfig) -> None:
    summary = shard_manifest(
        cfg.manifest,
        cfg.out_dir,
        split=cfg.split,
        workers=cfg.workers,
        feature=FeatureConfig(**OmegaConf.to_container(cfg.feature)),
        max_shard_utterances=cfg.max_shard_utterances,
        max_shard_bytes=cfg.max_shard_bytes,
        manifest_format=cfg.manifest_format,
        min_duration=cfg.min_duration,
        max_duration=cfg.max_duration,
        max_reject_fraction=cfg.max_reject_fraction,
        executor=build_executor_config(cfg.executor),
        progress=cfg.progress,
    )
    print(json.dumps(summary, indent=1, sort_keys=True))


if __name__ == "__main__":
    register_configs()  # NOTE: only for the CLI, so importing shard_manifest() leaves the ConfigStore alone
    main()
