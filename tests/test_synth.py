import json

import soundfile as sf

from asr.text import normalize
from data_prep.synth import plan_corpus, read_sentences, synthesize_corpus


def _records(path):
    return [json.loads(line) for line in path.open(encoding="utf-8")]


def test_corpus_splits_are_disjoint_and_audio_is_real_speech(speech_corpus):
    recs = {split: _records(path) for split, path in speech_corpus.items()}
    assert [len(recs[s]) for s in ("train", "dev", "test")] == [16, 4, 4]
    texts = {s: {normalize(r["text"]) for r in rs} for s, rs in recs.items()}
    assert (
        not texts["train"] & texts["test"]
        and not texts["train"] & texts["dev"]
        and not texts["dev"] & texts["test"]
    )
    for r in recs["test"]:
        info = sf.info(str(speech_corpus["test"].parent / r["audio"]))
        assert info.samplerate == 16000 and info.subtype == "PCM_16" and info.channels == 1
        assert 0.5 < info.duration < 10 and abs(info.duration - r["duration"]) < 1e-3
    assert len({r["speaker"] for rs in recs.values() for r in rs}) > 5  # voices vary


def test_plan_is_seeded_and_filters_unspeakable_lines(tmp_path):
    src = tmp_path / "s.txt"
    lines = ["call 555 1234 now please ok", "too short"] + [
        f"sentence number {w} is fine" for w in "abcdefghij"
    ]
    src.write_text("\n".join(lines))
    sentences = read_sentences(src)
    assert len(sentences) == 10  # digits and too-short lines dropped
    assert plan_corpus(sentences, 8, 3, 0.2, 0.2) == plan_corpus(sentences, 8, 3, 0.2, 0.2)
    assert plan_corpus(sentences, 8, 3, 0.2, 0.2) != plan_corpus(sentences, 8, 4, 0.2, 0.2)


def test_rerun_keeps_existing_wavs(speech_corpus, sentences_file):
    out = speech_corpus["train"].parent
    wav = out / _records(speech_corpus["train"])[0]["audio"]
    before = wav.stat().st_mtime_ns
    again = synthesize_corpus(
        out, 24, seed=0, sentences=sentences_file, dev_fraction=1 / 6, test_fraction=1 / 6
    )
    assert wav.stat().st_mtime_ns == before
    assert _records(again["train"]) == _records(speech_corpus["train"])


def test_restrict_vocabulary_keeps_sentences_of_common_words():
    from data_prep.synth import restrict_vocabulary

    pool = ["the cat sat down", "the dog sat down", "the cat ran down", "zebra quokka aardvark okapi"]
    kept = restrict_vocabulary(pool, 6)
    assert "zebra quokka aardvark okapi" not in kept and "the cat sat down" in kept
    assert restrict_vocabulary(pool, None) == pool
