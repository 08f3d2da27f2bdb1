"""Data-prep throughput: hours of audio per wall-second, bare loop vs the shard job with 1 and 2 workers.

    .venv/bin/python bench/bench_data_prep.py [--minutes 30] [--repeat 4]

Builds (once, cached under bench/out/) an espeak-ng corpus of at least ``--minutes`` of audio, lists it
``--repeat`` times under new ids (so each timed run lasts long enough for start-up costs to be visible but not
dominant), then measures in one run, side by side:
  bare loop   decode + features for every utterance, nothing written (torch single-threaded, like a worker)
  shard w=1   shard_manifest(workers=1): features + float16 + tar + sha256 + CMVN sums + atomic writes
  shard w=2   shard_manifest(workers=2)
Targets (DESIGN.md): w=2 >= 1.8x w=1; w=1 >= 0.8x bare loop. Other processes on the machine skew all three;
so the modes run interleaved for ``--rounds`` rounds and both the best and the median wall times are shown,
with the load average next to them, plus CPU time per audio hour (self + pool workers), which contention
barely moves: bare CPU / workers=1 CPU is the per-worker efficiency on an idle core.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import time
from pathlib import Path

import torch

from asr.audio import featurize
from data_prep.manifests import read_manifest
from data_prep.shard import shard_manifest
from data_prep.synth import synthesize_corpus

OUT = Path(__file__).resolve().parent / "out" / "data_prep"
SECONDS_PER_UTTERANCE = (
    2.5  # espeak-ng sentences run ~2-4 s; we synthesize more until the minutes are reached
)
TARGET_SPEEDUP = 1.8
TARGET_EFFICIENCY = 0.8


def build_corpus(minutes: float) -> list[Path]:
    """Synthesize (or reuse) a corpus with at least ``minutes`` of audio; returns its manifests."""
    n = int(minutes * 60 / SECONDS_PER_UTTERANCE)
    while True:
        manifests = synthesize_corpus(OUT / "corpus", n, seed=0, workers=2, progress=True)
        seconds = sum(r["duration"] for m in manifests.values() for r in read_manifest(m))
        if seconds >= minutes * 60:
            print(f"corpus: {n} utterances, {seconds / 60:.1f} min of audio")
            return list(manifests.values())
        n = int(n * minutes * 60 / seconds) + 10


def repeated_manifest(manifests: list[Path], repeat: int) -> Path:
    """One manifest listing the corpus ``repeat`` times under distinct ids (absolute audio paths)."""
    path = OUT / f"bench-x{repeat}.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for copy in range(repeat):
            for m in manifests:
                for r in read_manifest(m):
                    f.write(json.dumps({**r, "id": f"{r['id']}-{copy}"}) + "\n")
    return path


def cpu_seconds() -> float:
    """User + system CPU of this process and of its finished children (pool workers are joined at close)."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def bare_loop(manifest: Path) -> float:
    """Audio seconds; decode + features of every utterance, nothing kept (torch single-threaded)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    audio = sum(featurize(r["audio"])[1] for r in read_manifest(manifest))
    torch.set_num_threads(threads)
    return audio


def shard_run(manifest: Path, workers: int) -> float:
    """Audio seconds of a shard job into OUT/shards-w{workers} (emptied beforehand, outside the timing)."""
    out = OUT / f"shards-w{workers}"
    summary = shard_manifest(manifest, out, workers=workers, max_shard_utterances=100, progress=False)
    return summary["hours"] * 3600


def same_bytes(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.glob("*.tar")) + ["index.json", "cmvn.json"]
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


MODES = {
    "bare loop (decode+features)": bare_loop,
    "shard workers=1": lambda m: shard_run(m, 1),
    "shard workers=2": lambda m: shard_run(m, 2),
}
BARE, W1, W2 = MODES
SHARD_DIRS = {W1: OUT / "shards-w1", W2: OUT / "shards-w2"}


def measure(manifest: Path, rounds: int) -> tuple[float, dict[str, list[float]], dict[str, list[float]]]:
    """Run the modes ``rounds`` times, interleaved; returns (audio seconds, {mode: walls}, {mode: CPU seconds})."""
    walls: dict[str, list[float]] = {m: [] for m in MODES}
    cpus: dict[str, list[float]] = {m: [] for m in MODES}
    audio = []
    for _ in range(rounds):
        for mode, run in MODES.items():
            if mode in SHARD_DIRS:
                shutil.rmtree(SHARD_DIRS[mode], ignore_errors=True)
            wall, cpu = time.perf_counter(), cpu_seconds()
            audio.append(run(manifest))
            walls[mode].append(time.perf_counter() - wall)
            cpus[mode].append(cpu_seconds() - cpu)
    assert max(audio) - min(audio) < 1.0, "every mode must cover the same audio"
    return audio[0], walls, cpus


def report(audio: float, walls: dict[str, list[float]], cpus: dict[str, list[float]], rounds: int) -> None:
    hours = audio / 3600
    best = {m: hours / min(w) for m, w in walls.items()}  # audio hours per wall-second
    median = {m: hours / statistics.median(w) for m, w in walls.items()}
    per_cpu = {m: hours / statistics.median(c) for m, c in cpus.items()}  # audio hours per CPU-second
    print(f"\naudio per run: {hours:.3f} h; {rounds} interleaved rounds; rates in audio hours per second")
    print(
        f"{'mode':<30}{'walls (s)':>28}{'best h/s':>10}{'median h/s':>12}{'CPU s (median)':>16}{'h/CPU-s':>9}"
    )
    for m in MODES:
        ws = " ".join(f"{w:.1f}" for w in walls[m])
        cpu = statistics.median(cpus[m])
        print(f"{m:<30}{ws:>28}{best[m]:>10.4f}{median[m]:>12.4f}{cpu:>16.1f}{per_cpu[m]:>9.4f}")
    for label, rates in (("best wall", best), ("median wall", median), ("CPU time", per_cpu)):
        line = (
            f"{label:>12}: workers=1 / bare = {rates[W1] / rates[BARE]:.2f}x (target >= {TARGET_EFFICIENCY}x)"
        )
        if label != "CPU time":  # NOTE: CPU time cannot show a speed-up; it shows the work per audio hour
            line += f"; workers=2 / workers=1 = {rates[W2] / rates[W1]:.2f}x (target >= {TARGET_SPEEDUP}x)"
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    manifest = repeated_manifest(build_corpus(args.minutes), args.repeat)
    load_before = os.getloadavg()
    audio, walls, cpus = measure(manifest, args.rounds)
    load_after = os.getloadavg()
    report(audio, walls, cpus, args.rounds)
    print(f"byte-identical w=1 vs w=2 shards: {same_bytes(OUT / 'shards-w1', OUT / 'shards-w2')}")
    print(f"cpus: {os.cpu_count()}  load average (1/5/15 min) before: {load_before}  after: {load_after}")


if __name__ == "__main__":
    main()
