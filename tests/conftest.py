"""Shared fixtures: a tiny real speech corpus synthesized with espeak-ng, and its shards + tokenizer."""

from __future__ import annotations

from pathlib import Path

import pytest

# Our own sentences (not from any corpus), so the tests depend on nothing but espeak-ng.
SENTENCES = """\
the quick brown fox jumps over the lazy dog
a small model learns to read speech from sound
please bring the red cup to the kitchen table
the weather today is cold and windy near the coast
she sells bright shells by the quiet blue sea
we trained the network on a laptop without a graphics card
every shard holds features and a transcript for each utterance
turn left at the old bridge and walk to the river
my brother plays the violin every sunday morning
a warm cup of tea helps on a rainy afternoon
the train leaves the station at seven in the evening
green apples and yellow lemons fill the wooden basket
they built a tall tower of stones on the hill
the children laughed as the puppy chased its tail
open the window and let the fresh air inside
our team measured the speed of the data loader
the pilot checked the map before the long flight
he wrote a letter to his friend in the city
the garden needs water after a week of sun
a gentle wind moved the tall grass in the field
the doctor asked him to rest for three days
music filled the hall when the band began to play
the library closes early on friday afternoons
she painted the door a bright shade of orange
"""


@pytest.fixture(scope="session")
def sentences_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("text") / "sentences.txt"
    path.write_text(SENTENCES, encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def speech_corpus(tmp_path_factory, sentences_file) -> dict[str, Path]:
    """{split: manifest} of 24 espeak-ng utterances (16 train, 4 dev, 4 test), 16 kHz WAVs."""
    from data_prep.synth import synthesize_corpus

    out = tmp_path_factory.mktemp("corpus")
    return synthesize_corpus(
        out, 24, seed=0, sentences=sentences_file, dev_fraction=1 / 6, test_fraction=1 / 6
    )


@pytest.fixture(scope="session")
def tiny_shards(tmp_path_factory, speech_corpus) -> dict[str, Path]:
    """{split: shard dir} of the speech corpus (train split in 4 shards of 4 utterances), plus "tokenizer": .model."""
    import json

    from asr.text import normalize
    from asr.tokenizer import train_tokenizer
    from data_prep.shard import shard_manifest

    out = tmp_path_factory.mktemp("shards")
    dirs: dict[str, Path] = {}
    for split, manifest in speech_corpus.items():
        dirs[split] = out / split
        shard_manifest(manifest, dirs[split], split=split, workers=1, max_shard_utterances=4)
    texts = [normalize(json.loads(line)["text"]) for line in speech_corpus["train"].open(encoding="utf-8")]
    dirs["tokenizer"] = out / "tokenizer.model"
    train_tokenizer(texts, dirs["tokenizer"], vocab_size=64)
    return dirs
