"""Synthetic speech corpus (the embedded default dataset): espeak-ng reads English sentences aloud.

    python -m data_prep.synth out_dir=runs/demo/corpus num_utterances=4000 seed=0

Writes 16-bit 16 kHz WAVs under ``out_dir/wavs/`` and ``train.jsonl``, ``dev.jsonl``, ``test.jsonl`` manifests.
Sentences are split between train/dev/test *before* synthesis, so no dev/test sentence is ever heard in
training. Every utterance draws its own voice, variant, speed and pitch from a seeded RNG, so the corpus is the
same whatever the number of workers, and a rerun only synthesizes the WAVs that are missing.
"""

from __future__ import annotations

import io
import json
import random
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from omegaconf import MISSING

from asr.audio import SAMPLE_RATE, resample
from asr.text import normalize

FORTUNES_DIR = Path("/usr/share/games/fortunes")  # Debian package `fortunes`: thousands of English sentences
VOICES = (
    "en-us",
    "en-gb",
    "en-gb-scotland",
    "en-gb-x-rp",
    "en-gb-x-gbclan",
    "en-gb-x-gbcwmd",
    "en-029",
    "en-us-nyc",
)
VARIANTS = ("m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f4", "f5")
SPEED_WPM = (140, 190)  # espeak-ng -s range (words per minute); its default is 175
PITCH = (25, 75)  # espeak-ng -p range (0-99); its default is 50
MIN_WORDS, MAX_WORDS = 4, 20
SPLITS = ("train", "dev", "test")
_SPEAKABLE = re.compile(
    r"^[A-Za-z][A-Za-z ,.;:'!?\-]*$"
)  # no digits or symbols espeak would read differently
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


@dataclass(frozen=True)
class Utterance:
    id: str
    text: str  # as spoken; the manifest stores it, the shard writer normalizes it
    voice: str  # espeak-ng voice+variant, used as the speaker label
    speed: int
    pitch: int


def read_sentences(source: str | Path | None = None) -> list[str]:
    """Distinct speakable sentences from a text file (one per line) or, by default, Debian's fortunes."""
    if source is not None:
        lines: Iterable[str] = Path(source).read_text(encoding="utf-8").splitlines()
    elif FORTUNES_DIR.is_dir():
        lines = _fortune_sentences(FORTUNES_DIR)
    else:
        raise FileNotFoundError(
            f"no sentence source: {FORTUNES_DIR} is missing (apt-get install fortunes) and no sentences=FILE was given"
        )
    seen: dict[str, str] = {}
    for line in lines:
        s = " ".join(line.split())
        words = normalize(s).split()
        if MIN_WORDS <= len(words) <= MAX_WORDS and _SPEAKABLE.match(s):
            seen.setdefault(" ".join(words), s)
    return sorted(seen.values())


def restrict_vocabulary(sentences: list[str], max_words: int | None) -> list[str]:
    """Keep sentences made only of the ``max_words`` most frequent words of the pool (None: keep all).

    NOTE: the fortunes pool has ~17k distinct words in ~17k sentences, so most test words would never be heard in
    a few hours of training. The 3,000 most frequent words still leave ~5,000 sentences with ~2,800 distinct words:
    open-vocabulary English, with a vocabulary a 4-hour corpus can cover.
    """
    if not max_words:
        return sentences
    words = [normalize(s).split() for s in sentences]
    common = {w for w, _ in Counter(w for ws in words for w in ws).most_common(max_words)}
    return [s for s, ws in zip(sentences, words, strict=True) if all(w in common for w in ws)]


def _fortune_sentences(folder: Path) -> Iterator[str]:
    """Sentences of the fortune files (top level only: the offensive ones live in off/)."""
    for path in sorted(folder.iterdir()):
        if path.is_dir() or path.suffix in (".dat", ".u8") or path.is_symlink():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for fortune in text.split("\n%\n"):
            body = " ".join(ln for ln in fortune.splitlines() if not ln.lstrip().startswith("--"))
            yield from _SENTENCE_END.split(body)


def plan_corpus(
    sentences: list[str], num_utterances: int, seed: int, dev_fraction: float, test_fraction: float
):
    """Assign sentences to splits (disjoint) and draw a voice/speed/pitch per utterance. Returns {split: [Utterance]}."""
    rng = random.Random(seed)
    pool = sentences[:]
    rng.shuffle(pool)
    n_test = max(1, round(num_utterances * test_fraction))
    n_dev = max(1, round(num_utterances * dev_fraction))
    n_train = num_utterances - n_test - n_dev
    if n_train < 1 or len(pool) < n_test + n_dev + 1:
        raise ValueError(
            f"{len(pool)} sentences cannot make {num_utterances} utterances with disjoint splits"
        )
    chosen = {"test": pool[:n_test], "dev": pool[n_test : n_test + n_dev]}
    train_pool = pool[n_test + n_dev :]
    # NOTE: train sentences repeat (with other voices) only when the pool is smaller than the train split.
    chosen["train"] = [train_pool[i % len(train_pool)] for i in range(n_train)]
    plan, index = {}, 0
    for split in SPLITS:
        plan[split] = []
        for text in chosen[split]:
            voice = f"{rng.choice(VOICES)}+{rng.choice(VARIANTS)}"
            plan[split].append(
                Utterance(f"{split}-{index:06d}", text, voice, rng.randint(*SPEED_WPM), rng.randint(*PITCH))
            )
            index += 1
    return plan


def synthesize(utt: Utterance, path: Path) -> float:
    """Speak one utterance into a 16 kHz 16-bit mono WAV (atomically); returns its duration in seconds."""
    cmd = ["espeak-ng", "-v", utt.voice, "-s", str(utt.speed), "-p", str(utt.pitch), "--stdout", utt.text]
    wav_bytes = subprocess.run(cmd, check=True, capture_output=True).stdout
    data, sr = sf.read(io.BytesIO(wav_bytes), dtype="float32")
    wav = resample(torch.from_numpy(data), sr, SAMPLE_RATE).numpy()
    tmp = path.with_suffix(".tmp.wav")
    sf.write(tmp, np.clip(wav, -1.0, 1.0), SAMPLE_RATE, subtype="PCM_16")
    tmp.replace(path)
    return len(wav) / SAMPLE_RATE


def _synthesize_if_missing(args: tuple[Utterance, Path]) -> float:
    utt, path = args
    if path.exists():
        return sf.info(str(path)).duration
    return synthesize(utt, path)


def synthesize_corpus(
    out_dir: str | Path,
    num_utterances: int,
    seed: int = 0,
    sentences: str | Path | None = None,
    dev_fraction: float = 0.05,
    test_fraction: float = 0.05,
    workers: int = 2,
    progress: bool = False,
    max_vocabulary: int | None = None,
) -> dict[str, Path]:
    """Synthesize the corpus; returns {split: manifest path}. Existing WAVs are kept (rerun = resume)."""
    if shutil.which("espeak-ng") is None:
        raise FileNotFoundError(
            "espeak-ng is not installed (apt-get install espeak-ng, or run `make sysdeps`)"
        )
    out = Path(out_dir)
    (out / "wavs").mkdir(parents=True, exist_ok=True)
    plan = plan_corpus(
        restrict_vocabulary(read_sentences(sentences), max_vocabulary),
        num_utterances,
        seed,
        dev_fraction,
        test_fraction,
    )
    manifests = {}
    # NOTE: forked workers hang in their first torch op (resample) if the parent already ran multi-threaded
    # torch (e.g. an earlier test); one intra-op thread per worker avoids it.
    with ProcessPoolExecutor(
        max_workers=max(1, workers), initializer=torch.set_num_threads, initargs=(1,)
    ) as pool:
        for split, utts in plan.items():
            jobs = [(u, out / "wavs" / f"{u.id}.wav") for u in utts]
            durations = pool.map(_synthesize_if_missing, jobs, chunksize=16)
            if progress:
                from tqdm import tqdm

                durations = tqdm(durations, total=len(jobs), desc=f"synth {split}", unit="utt")
            manifests[split] = _write_manifest(out / f"{split}.jsonl", jobs, list(durations))
    return manifests


def _write_manifest(path: Path, jobs: list[tuple[Utterance, Path]], durations: list[float]) -> Path:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        for (u, wav), dur in zip(jobs, durations, strict=True):
            rec = {
                "id": u.id,
                "audio": f"wavs/{wav.name}",
                "text": u.text,
                "speaker": u.voice,
                "duration": round(dur, 4),
            }
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    tmp.replace(path)
    return path


# --- CLI -------------------------------------------------------------------------------------------------------
@dataclass
class SynthConfig:
    out_dir: str = MISSING
    num_utterances: int = 4000
    seed: int = 0
    sentences: str | None = None  # a text file, one sentence per line; default: Debian's fortunes
    dev_fraction: float = 0.05
    test_fraction: float = 0.05
    workers: int = 2
    max_vocabulary: int | None = 3000  # keep sentences made of the pool's N most frequent words; null: all


def _main() -> None:
    import hydra
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="synth_schema", node=SynthConfig)

    @hydra.main(version_base=None, config_path="../conf", config_name="synth")
    def main(cfg: SynthConfig) -> None:
        manifests = synthesize_corpus(
            cfg.out_dir, cfg.num_utterances, cfg.seed, cfg.sentences, cfg.dev_fraction, cfg.test_fraction,
            cfg.workers, progress=True, max_vocabulary=cfg.max_vocabulary,
        )  # fmt: skip
        for split, path in manifests.items():
            n = sum(1 for _ in path.open())
            hours = sum(json.loads(ln)["duration"] for ln in path.open()) / 3600
            print(f"{split}: {n} utterances, {hours:.2f} h -> {path}")

    main()


if __name__ == "__main__":
    _main()
