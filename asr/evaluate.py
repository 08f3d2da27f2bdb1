"""Evaluate a model bundle: WER, CER, S/I/D, real-time factor, and per-utterance errors (worst first).

    python -m asr.evaluate model=runs/demo/model.pt data=runs/demo/shards/test [decoding=beam decoding.lm=LM.arpa]

``data`` is a shard directory (features read from ``*.feats.npy``) or a JSONL manifest (audio featurized with
``asr.audio.featurize``). Writes ``summary.json`` and ``utterances.jsonl`` to ``out_dir`` (default: next to the
model, ``eval-<data name>/``).
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import hydra
import numpy as np
import torch
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from asr.audio import AudioError, FeatureConfig, featurize
from asr.bundle import load_bundle
from asr.decoding import DecodingOptions
from asr.longform import ChunkingConfig, Transcriber
from asr.schema import register_yaml_group, writable_schema
from asr.scoring import error_rates, word_edits
from asr.text import normalize

SHARD_INDEX = "index.json"
SUMMARY_FILE = "summary.json"
UTTERANCES_FILE = "utterances.jsonl"


@dataclass
class EvaluateConfig:
    model: str = MISSING  # model bundle (.pt)
    data: str = MISSING  # shard directory (with index.json) or JSONL manifest
    out_dir: str = ""  # "" = <model dir>/eval-<data name>
    device: str = "cpu"
    batch_size: int = 16  # utterances (chunks) per forward pass
    max_utterances: int = 0  # 0 = all
    decoding: DecodingOptions = field(default_factory=DecodingOptions)
    chunking: ChunkingConfig = field(default_factory=ChunkingConfig)


@dataclass(frozen=True)
class Utterance:
    key: str
    text: str  # reference transcript
    feats: torch.Tensor | None  # [T, D] raw features; None when the audio could not be used
    duration: float  # seconds
    reject: str = ""  # why the utterance is skipped ("" = usable)


def evaluate(cfg: EvaluateConfig) -> dict:
    """Run the evaluation ``cfg`` describes; writes and returns the summary."""
    bundle = load_bundle(cfg.model, cfg.device)
    transcriber = Transcriber.from_bundle(
        bundle, cfg.decoding, chunking=cfg.chunking, max_batch=cfg.batch_size
    )
    out_dir = build_out_dir(cfg)
    rows, skipped, audio_s, busy_s = [], Counter(), 0.0, 0.0
    for batch, read_s in _batches(read_utterances(cfg.data, bundle.feature), cfg):
        usable = [u for u in batch if not u.reject]
        skipped.update(u.reject for u in batch if u.reject)
        start = time.perf_counter()
        transcripts = transcriber([(u.feats, u.duration) for u in usable]) if usable else []
        busy_s += time.perf_counter() - start + read_s
        audio_s += sum(u.duration for u in usable)
        rows += [utterance_row(u, t.text) for u, t in zip(usable, transcripts, strict=True)]
    summary = build_summary(cfg, rows, skipped, audio_s, busy_s)
    write_report(out_dir, summary, rows)
    return summary


def build_out_dir(cfg: EvaluateConfig) -> Path:
    """The report folder (created): ``cfg.out_dir``, or ``eval-<data name>`` beside the model."""
    data = Path(cfg.data)
    out = Path(cfg.out_dir) if cfg.out_dir else Path(cfg.model).parent / f"eval-{data.stem or data.name}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _batches(utts: Iterator[Utterance], cfg: EvaluateConfig) -> Iterator[tuple[list[Utterance], float]]:
    """Groups of ``batch_size`` utterances, with the seconds spent reading/featurizing each group."""
    batch, n, start = [], 0, time.perf_counter()
    for u in utts:
        if cfg.max_utterances and n >= cfg.max_utterances:
            break
        batch.append(u)
        n += 1
        if len(batch) == cfg.batch_size:
            yield batch, time.perf_counter() - start
            batch = []
            start = time.perf_counter()
    if batch:
        yield batch, time.perf_counter() - start


def read_utterances(data: str | Path, feature: FeatureConfig) -> Iterator[Utterance]:
    """Utterances from a shard directory or a JSONL manifest."""
    path = Path(data)
    if (path / SHARD_INDEX).is_file():
        yield from read_shard_dir(path, feature)
    elif path.is_file():
        yield from read_manifest(path, feature)
    else:
        raise FileNotFoundError(
            f"{path} is neither a shard directory (with {SHARD_INDEX}) nor a manifest file"
        )


def read_shard_dir(path: Path, feature: FeatureConfig) -> Iterator[Utterance]:
    """Stored features of every sample of every shard listed in ``index.json``, in index order."""
    index = json.loads((path / SHARD_INDEX).read_text(encoding="utf-8"))
    stored = FeatureConfig.from_dict(index["feature"])
    if stored != feature:
        raise ValueError(f"shards hold {stored} features but the model expects {feature}")
    for shard in index["shards"]:
        for key, files in _tar_samples(path / shard["name"]):
            meta = json.loads(files["json"])
            feats = torch.from_numpy(np.load(io.BytesIO(files["feats.npy"])).astype(np.float32))  # [T, D]
            utt_id = str(
                meta.get("id", key)
            )  # NOTE: the corpus id; the tar key may be a sanitized form of it
            yield Utterance(utt_id, files["txt"].decode("utf-8"), feats, float(meta["duration"]))


def _tar_samples(tar_path: Path) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(key, {extension: bytes}) per sample; members of one sample are adjacent (WebDataset convention)."""
    key, files = None, {}
    with tarfile.open(tar_path) as tar:
        for member in tar:
            if not member.isfile():
                continue
            k, _, ext = member.name.rpartition("/")[2].partition(".")
            if k != key and files:
                yield key, files
                files = {}
            key, files[ext] = k, tar.extractfile(member).read()
    if files:
        yield key, files


def read_manifest(path: Path, feature: FeatureConfig) -> Iterator[Utterance]:
    """Featurize each manifest line's audio (relative paths are relative to the manifest's directory)."""
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            row = json.loads(line)
            key, audio = str(row.get("id", n)), path.parent / row["audio"]
            try:
                feats, duration = featurize(audio, feature, row.get("start"), row.get("end"))
            except (AudioError, OSError) as e:
                yield Utterance(
                    key, row.get("text", ""), None, 0.0, reject=type(e).__name__ + ": " + str(e)[:120]
                )
                continue
            yield Utterance(key, row["text"], feats, duration)


def utterance_row(u: Utterance, hyp: str) -> dict:
    """Per-utterance record: normalized reference and hypothesis, and their word edit counts."""
    ref, hyp = normalize(u.text), normalize(hyp)
    s, d, i = word_edits(ref, hyp)
    words = len(ref.split())
    return {
        "key": u.key,
        "ref": ref,
        "hyp": hyp,
        "errors": s + d + i,
        "substitutions": s,
        "deletions": d,
        "insertions": i,
        "ref_words": words,
        "wer": (s + d + i) / max(1, words),
        "duration": round(u.duration, 3),
    }


def build_summary(
    cfg: EvaluateConfig, rows: list[dict], skipped: Counter, audio_s: float, busy_s: float
) -> dict:
    """Corpus error rates (asr.scoring), skip counts by reason, and the real-time factor."""
    rates = error_rates([r["ref"] for r in rows], [r["hyp"] for r in rows])
    return {
        "model": str(cfg.model),
        "data": str(cfg.data),
        "decoding": asdict(cfg.decoding),
        **rates.to_dict(),
        "skipped": sum(skipped.values()),
        "skip_reasons": dict(skipped),
        "audio_seconds": round(audio_s, 3),
        "processing_seconds": round(busy_s, 3),
        "rtf": busy_s / audio_s
        if audio_s
        else None,  # processing time / audio time (features + model + decode)
    }


def write_report(out_dir: Path, summary: dict, rows: list[dict]) -> None:
    """summary.json, and utterances.jsonl sorted worst first (most errors, then highest WER)."""
    worst_first = sorted(rows, key=lambda r: (-r["errors"], -r["wer"], r["key"]))
    with (out_dir / UTTERANCES_FILE).open("w", encoding="utf-8") as f:
        for r in worst_first:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    (out_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")


def format_summary(summary: dict, out_dir: Path) -> str:
    """A short table for the terminal."""
    rtf = summary["rtf"]
    lines = [
        f"WER {summary['wer']:.2%}  CER {summary['cer']:.2%}  "
        f"(S {summary['substitutions']}, D {summary['deletions']}, I {summary['insertions']}; "
        f"{summary['ref_words']} words, {summary['utterances']} utterances, {summary['skipped']} skipped)",
        f"RTF {rtf:.4f} ({summary['processing_seconds']:.1f} s for {summary['audio_seconds']:.1f} s of audio)"
        if rtf is not None
        else "RTF n/a (no audio)",
        f"report: {out_dir / SUMMARY_FILE}, {out_dir / UTTERANCES_FILE}",
    ]
    return "\n".join(lines)


def register_configs() -> None:
    """The CLI's Hydra schema and decoding presets (only for the CLI: importing evaluate() leaves them alone)."""
    ConfigStore.instance().store(name="evaluate_schema", node=writable_schema(EvaluateConfig))
    register_yaml_group("decoding")


@hydra.main(version_base=None, config_path="../conf/evaluate", config_name="evaluate")
def main(cfg) -> None:
    config: EvaluateConfig = OmegaConf.to_object(cfg)
    summary = evaluate(config)
    print(format_summary(summary, build_out_dir(config)))


if __name__ == "__main__":
    register_configs()
    main()
