"""Training benchmarks, measured side by side in one run:

    .venv/bin/python bench/bench_training.py [--utterances 200] [--steps 30] [--rounds 3]

  1. Lightning overhead: ``ASRSystem`` in a ``lightning.Trainer`` vs a plain PyTorch loop doing the same work
     (forward, float32 CTC, backward, clipping, AdamW, LR schedule) on the same tiny model and the same
     batches. Modes alternate for ``--rounds`` rounds; best and median step times. Target <= 1.05x.
  2. Padding efficiency (real frames / padded frames) with and without duration bucketing, on the espeak
     corpus and on a LibriSpeech-like length distribution (1-20 s, lognormal). Target >= 95% with.
  3. Loader throughput: seconds of audio per wall-second delivered by one worker (read tar, decode float16
     features, tokenize, SpecAugment, pad), in the main process. Target >= 20,000.

Builds (once, cached under bench/out/training/) an espeak-ng corpus, its shards and a tokenizer.
Other processes on the machine slow every mode; the load average is printed next to the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

import lightning as L
import torch

from asr.data import PipelineOptions, ShardStream, StreamPosition, bucket_batches, read_index
from asr.model import ASRModel, ModelConfig, ctc_loss
from asr.system import ASRSystem, OptimConfig, lr_factor
from asr.text import normalize
from asr.tokenizer import Tokenizer, train_tokenizer
from data_prep.shard import shard_manifest
from data_prep.synth import synthesize_corpus

OUT = Path(__file__).resolve().parent / "out" / "training"
MAX_FRAMES = 4_000  # CPU-sized batches for the step comparison
LOADER_MAX_FRAMES = 20_000  # the default data config
WARMUP_STEPS = 3  # untimed steps per mode (allocator, autograd graph caches)
GRAD_CLIP = 5.0
TARGET_OVERHEAD, TARGET_PADDING, TARGET_LOADER = 1.05, 0.95, 20_000
TINY = ModelConfig(encoder="conformer", d_model=144, num_layers=4, num_heads=4, subsampling_channels=16)


def build_data(utterances: int) -> tuple[str, Tokenizer]:
    """Synthesize (or reuse) a corpus, its train shards and tokenizer; returns (shard dir, tokenizer)."""
    shards, model = OUT / "shards", OUT / "tokenizer.model"
    if not (shards / "index.json").exists():
        manifests = synthesize_corpus(OUT / "corpus", utterances, seed=0, dev_fraction=0.0, test_fraction=0.0)
        shard_manifest(manifests["train"], shards, split="train", workers=1, max_shard_utterances=50)
    if not model.exists():
        texts = [normalize(json.loads(line)["text"]) for line in (OUT / "corpus" / "train.jsonl").open()]
        train_tokenizer(texts, model, vocab_size=128)
    return str(shards), Tokenizer(model)


def load_batches(shard_dir: str, tokenizer: Tokenizer, max_frames: int, **opts) -> list[dict]:
    stream = ShardStream(
        read_index(shard_dir)["shards"], tokenizer, PipelineOptions(max_frames_per_batch=max_frames, **opts)
    )
    return list(stream.batches(StreamPosition()))


# --- 1. Lightning vs plain loop ---------------------------------------------------------------------------


class StepTimer(L.Callback):
    """Wall time of the timed steps (after the warm-up), batch start to batch end."""

    def __init__(self) -> None:
        self.start = self.end = 0.0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == WARMUP_STEPS:
            self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.end = time.perf_counter()


def lightning_step_seconds(
    batches: list[dict], cfg: ModelConfig, optim: OptimConfig, tokenizer, tmp: Path
) -> float:
    torch.manual_seed(0)
    system = ASRSystem(cfg, optim, tokenizer)
    timer = StepTimer()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=len(batches),
        logger=L.pytorch.loggers.TensorBoardLogger(tmp, name="bench"),  # logging on, as in real runs
        log_every_n_steps=10,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=GRAD_CLIP,
        callbacks=[timer],
    )
    trainer.fit(system, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    return (timer.end - timer.start) / (len(batches) - WARMUP_STEPS)


def plain_step_seconds(batches: list[dict], cfg: ModelConfig, optim: OptimConfig) -> float:
    torch.manual_seed(0)
    model = ASRModel(cfg).train()
    opt = torch.optim.AdamW(model.parameters(), lr=optim.lr, betas=(optim.beta1, optim.beta2), eps=optim.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, optim, 0))
    for i, b in enumerate(batches):
        if i == WARMUP_STEPS:
            start = time.perf_counter()
        logits, out_lens = model(b["feats"], b["feat_lens"])
        loss = ctc_loss(logits, out_lens, b["targets"], b["target_lens"])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    return (time.perf_counter() - start) / (len(batches) - WARMUP_STEPS)


def bench_overhead(shard_dir: str, tokenizer: Tokenizer, steps: int, rounds: int) -> None:
    batches = load_batches(shard_dir, tokenizer, MAX_FRAMES, spec_augment=True)
    batches = (batches * (1 + steps // len(batches)))[: steps + WARMUP_STEPS]
    cfg = ModelConfig(**{**TINY.to_dict(), "vocab_size": tokenizer.vocab_size})
    optim = OptimConfig(warmup_steps=100)
    plain, lightning = [], []
    for _ in range(rounds):
        plain.append(plain_step_seconds(batches, cfg, optim))
        lightning.append(lightning_step_seconds(batches, cfg, optim, tokenizer, OUT / "tb"))
    print(f"\n1. training step, tiny conformer ({ASRModel(cfg).num_parameters() / 1e6:.1f}M params), "
          f"{len(batches) - WARMUP_STEPS} timed steps x {rounds} rounds, batches <= {MAX_FRAMES} frames, "
          f"{torch.get_num_threads()} thread(s)")  # fmt: skip
    print(f"{'mode':<12}{'best ms':>10}{'median ms':>12}")
    for name, t in (("plain loop", plain), ("lightning", lightning)):
        print(f"{name:<12}{min(t) * 1e3:>10.1f}{statistics.median(t) * 1e3:>12.1f}")
    ratio_best, ratio_median = (
        min(lightning) / min(plain),
        statistics.median(lightning) / statistics.median(plain),
    )
    print(
        f"lightning / plain: best {ratio_best:.3f}x, median {ratio_median:.3f}x (target <= {TARGET_OVERHEAD}x)"
    )


# --- 2. padding efficiency ---------------------------------------------------------------------------------


def efficiency(batches: list[list[dict]]) -> float:
    real = sum(s["num_frames"] for b in batches for s in b)
    return real / sum(len(b) * max(s["num_frames"] for s in b) for b in batches)


def librispeech_like(n: int, seed: int = 0) -> list[dict]:
    """Utterance lengths (frames) from a lognormal fitted by eye to LibriSpeech: median ~14 s, 1-20 s range."""
    rng = random.Random(seed)
    return [{"num_frames": int(100 * min(20.0, max(1.0, rng.lognormvariate(2.5, 0.5))))} for _ in range(n)]


def bench_padding(shard_dir: str, tokenizer: Tokenizer) -> None:
    print("\n2. padding efficiency (real / padded frames); sort buffer of 500 utterances when bucketing")
    print(f"{'lengths':<26}{'max frames':>11}{'no bucketing':>14}{'bucketing':>12}")
    lens = [int(n) for x in load_batches(shard_dir, tokenizer, 10**9) for n in x["feat_lens"]]
    cases = [
        ("espeak corpus", [{"num_frames": n} for n in lens], MAX_FRAMES),
        ("espeak corpus", [{"num_frames": n} for n in lens], LOADER_MAX_FRAMES),
        ("librispeech-like (20k)", librispeech_like(20_000), LOADER_MAX_FRAMES),
    ]
    for name, samples, max_frames in cases:
        random.Random(1).shuffle(samples)
        off = efficiency(list(bucket_batches(samples, max_frames, 0, random.Random(0))))
        on = efficiency(list(bucket_batches(samples, max_frames, 500, random.Random(0))))
        print(f"{name:<26}{max_frames:>11,}{off:>14.1%}{on:>12.1%}")
    print(
        f"target with bucketing >= {TARGET_PADDING:.0%}; a corpus of a few hundred utterances fills only a few 20k-frame batches, each spanning many lengths"
    )


# --- 3. loader throughput ---------------------------------------------------------------------------------


def bench_loader(shard_dir: str, tokenizer: Tokenizer, epochs: int) -> None:
    stream = ShardStream(
        read_index(shard_dir)["shards"],
        tokenizer,
        PipelineOptions(max_frames_per_batch=LOADER_MAX_FRAMES, spec_augment=True),
    )
    print(f"\n3. loader throughput, one worker (main process), {epochs} epochs of the shards")
    print(f"{'pipeline':<34}{'audio s':>10}{'wall s':>9}{'audio s / s':>13}")
    for name, augment in (("read+decode+tokenize+pad", False), ("... + SpecAugment", True)):
        stream.options = PipelineOptions(max_frames_per_batch=LOADER_MAX_FRAMES, spec_augment=augment)
        audio, start = 0.0, time.perf_counter()
        for epoch in range(epochs):
            for batch in stream.batches(StreamPosition(epoch=epoch)):
                audio += batch["audio_seconds"]
        wall = time.perf_counter() - start
        print(f"{name:<34}{audio:>10.0f}{wall:>9.2f}{audio / wall:>13,.0f}")
    print(f"target >= {TARGET_LOADER:,} audio s / s")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--utterances", type=int, default=200)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--loader-epochs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shard_dir, tokenizer = build_data(args.utterances)
    print(f"shards: {read_index(shard_dir)['utterances']} utterances, {read_index(shard_dir)['hours'] * 60:.1f} min; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")  # fmt: skip
    bench_overhead(shard_dir, tokenizer, args.steps, args.rounds)
    bench_padding(shard_dir, tokenizer)
    bench_loader(shard_dir, tokenizer, args.loader_epochs)
    print(f"\nload average at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
