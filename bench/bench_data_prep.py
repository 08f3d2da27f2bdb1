"""Data-prep throughput: hours of audio per wall-second, bare loop vs the shard job with 1 and 2 workers.

    .venv/bin/python bench/bench_data_prep.py [--minutes 30] [--repeat 4]

Builds (once, cached under bench/out/) an espeak-ng corpus of at least ``--minutes`` of audio, lists it
``--repeat`` times under new ids (so each timed run lasts long enough for start-up costs to be visible but not
dominant), then measures in one run, side by side:
  bare loop   decode + features for every utterance, nothing written (torch single-threaded, like a worker)
  shard w=1   shard_manifest(workers=1): features + float16 + tar + sha256 + CMVN sums + atomic writes
  shard w=2   shard_manifest(workers=2)
Targets (DESIGN.md): w=2 >= 1.8x w=1; w=1 >= 0.8x bare loop. Other processes on the machine skew all three;
so the modes run interleaved for ``--rounds`` rounds and both the best and the median are shown, with the
load average next to them.
"""

from __future__ import annotations

import argparse
import json
import os
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


def bare_loop(manifest: Path) -> tuple[float, float]:
    """(audio seconds, wall seconds) for decode + features of every utterance, nothing kept."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    start, audio = time.perf_counter(), 0.0
    for r in read_manifest(manifest):
        _, duration = featurize(r["audio"])
        audio += duration
    wall = time.perf_counter() - start
    torch.set_num_threads(threads)
    return audio, wall


def shard_run(manifest: Path, workers: int) -> tuple[float, float, Path]:
    """(audio seconds, wall seconds, out dir) of a fresh shard job."""
    out = OUT / f"shards-w{workers}"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    summary = shard_manifest(manifest, out, workers=workers, max_shard_utterances=100, progress=False)
    return summary["hours"] * 3600, time.perf_counter() - start, out


def same_bytes(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.glob("*.tar")) + ["index.json", "cmvn.json"]
    return all((a / n).read_bytes() == (b / n).read_bytes() for n in names)


MODES = ("bare loop (decode+features)", "shard workers=1", "shard workers=2")


def measure(manifest: Path, rounds: int) -> tuple[float, dict[str, list[float]], list[Path]]:
    """Run the three modes ``rounds`` times, interleaved; returns (audio seconds, {mode: walls}, shard dirs)."""
    walls: dict[str, list[float]] = {m: [] for m in MODES}
    audio = 0.0
    for _ in range(rounds):
        audio, wall = bare_loop(manifest)
        walls[MODES[0]].append(wall)
        for workers, mode in ((1, MODES[1]), (2, MODES[2])):
            shard_audio, wall, _ = shard_run(manifest, workers)
            assert abs(shard_audio - audio) < 1.0, "the shard job must cover the same audio"
            walls[mode].append(wall)
    return audio, walls, [OUT / "shards-w1", OUT / "shards-w2"]


def report(audio: float, walls: dict[str, list[float]], rounds: int) -> None:
    best = {m: audio / 3600 / min(w) for m, w in walls.items()}  # audio hours per wall-second
    median = {m: audio / 3600 / statistics.median(w) for m, w in walls.items()}
    print(
        f"\naudio per run: {audio / 3600:.3f} h; {rounds} interleaved rounds; rates in audio hours per wall-second"
    )
    print(f"{'mode':<30}{'walls (s)':>24}{'best h/s':>10}{'median h/s':>12}{'best x bare':>13}")
    for m in MODES:
        ws = " ".join(f"{w:.1f}" for w in walls[m])
        print(f"{m:<30}{ws:>24}{best[m]:>10.4f}{median[m]:>12.4f}{best[m] / best[MODES[0]]:>13.2f}")
    for label, rates in (("best", best), ("median", median)):
        speedup = rates[MODES[2]] / rates[MODES[1]]
        efficiency = rates[MODES[1]] / rates[MODES[0]]
        print(
            f"{label:>6}: workers=2 / workers=1 = {speedup:.2f}x (target >= {TARGET_SPEEDUP}x); "
            f"workers=1 / bare = {efficiency:.2f}x (target >= {TARGET_EFFICIENCY}x)"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    manifest = repeated_manifest(build_corpus(args.minutes), args.repeat)
    load_before = os.getloadavg()
    audio, walls, (out1, out2) = measure(manifest, args.rounds)
    load_after = os.getloadavg()
    report(audio, walls, args.rounds)
    print(f"byte-identical w=1 vs w=2 shards: {same_bytes(out1, out2)}")
    print(f"cpus: {os.cpu_count()}  load average (1/5/15 min) before: {load_before}  after: {load_after}")


if __name__ == "__main__":
    main()
