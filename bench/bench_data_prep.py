"""Data-prep throughput: hours of audio per wall-second, bare loop vs the shard job with 1 and 2 workers.

    .venv/bin/python bench/bench_data_prep.py [--minutes 30] [--repeat 4]

Builds (once, cached under bench/out/) an espeak-ng corpus of at least ``--minutes`` of audio, lists it
``--repeat`` times under new ids (so each timed run lasts long enough for start-up costs to be visible but not
dominant), then measures in one run, side by side:
  bare loop   decode + features for every utterance, nothing written (torch single-threaded, like a worker)
  shard w=1   shard_manifest(workers=1): features + float16 + tar + sha256 + CMVN sums + atomic writes
  shard w=2   shard_manifest(workers=2)
Targets (DESIGN.md): w=2 >= 1.8x w=1; w=1 >= 0.8x bare loop. Other processes on the machine skew all three;
the load average is printed next to the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--repeat", type=int, default=4)
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    manifest = repeated_manifest(build_corpus(args.minutes), args.repeat)
    load_before = os.getloadavg()
    rows = {"bare loop (decode+features)": bare_loop(manifest)}
    audio1, wall1, out1 = shard_run(manifest, 1)
    audio2, wall2, out2 = shard_run(manifest, 2)
    rows["shard workers=1"], rows["shard workers=2"] = (audio1, wall1), (audio2, wall2)
    load_after = os.getloadavg()
    rate = {k: a / 3600 / w for k, (a, w) in rows.items()}
    bare = rate["bare loop (decode+features)"]
    print(f"\n{'mode':<30}{'audio h':>9}{'wall s':>9}{'audio h/s':>11}{'x bare':>8}")
    for k, (a, w) in rows.items():
        print(f"{k:<30}{a / 3600:>9.3f}{w:>9.2f}{rate[k]:>11.4f}{rate[k] / bare:>8.2f}")
    speedup = rate["shard workers=2"] / rate["shard workers=1"]
    efficiency = rate["shard workers=1"] / bare
    print(f"\nworkers=2 / workers=1 : {speedup:.2f}x (target >= {TARGET_SPEEDUP}x)")
    print(f"workers=1 / bare loop : {efficiency:.2f}x (target >= {TARGET_EFFICIENCY}x)")
    print(f"byte-identical w=1 vs w=2 shards: {same_bytes(out1, out2)}")
    print(f"cpus: {os.cpu_count()}  load average (1/5/15 min) before: {load_before}  after: {load_after}")


if __name__ == "__main__":
    main()
