"""The demo's word n-gram LM: a proper backoff model in ARPA that the beam-search decoder reads."""

import math

import pytest

from asr.decoding import arpa_words
from data_prep.lm import BOS, EOS, UNK, _prob, count_ngrams, estimate, train_lm

TEXT = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog", "The cat sat!"]


def _read_arpa(path):
    """{order: {gram: (logprob, backoff)}} from an ARPA file."""
    levels, order = {}, 0
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("\\") and line.endswith("-grams:"):
            order = int(line[1:].split("-")[0])
            levels[order] = {}
        elif order and line.strip() and not line.startswith("\\"):
            parts = line.split("\t")
            levels[order][tuple(parts[1].split())] = (
                float(parts[0]),
                float(parts[2]) if len(parts) > 2 else 0.0,
            )
    return levels


@pytest.mark.parametrize("order", [2, 3])
def test_every_context_is_a_probability_distribution(tmp_path, order):
    probs, backoffs = estimate(count_ngrams([t.lower().replace("!", "") for t in TEXT], order), 0.7)
    lin_p = [{g: 10**v for g, v in level.items()} for level in probs]
    lin_b = [{g: 10**v for g, v in level.items()} for level in backoffs]
    vocab = [g[0] for g in probs[0]]  # every predictable word, </s> and <unk> included
    assert BOS not in vocab and EOS in vocab and UNK in vocab
    for ctx in [(BOS,), ("the",), ("sat",), ("dog",), (BOS, "the"), ("the", "cat"), ("on", "the")][
        : 4 if order == 2 else 7
    ]:
        ctx = ctx[-(order - 1) :]
        total = sum(_prob(lin_p, lin_b, (*ctx, w)) for w in vocab)
        assert math.isclose(total, 1.0, rel_tol=1e-6), (ctx, total)


def test_arpa_file_has_counts_headers_and_normalized_words(tmp_path):
    out = train_lm(TEXT, tmp_path / "lm.arpa", order=3)
    text = out.read_text(encoding="utf-8")
    levels = _read_arpa(out)
    for k, grams in levels.items():
        assert f"ngram {k}={len(grams)}" in text
    assert ("the", "cat", "sat") in levels[3] and levels[1][(BOS,)][0] == -99.0
    assert arpa_words(out) == sorted({"the", "cat", "sat", "on", "mat", "dog", "log", "a", "and"})
    seen = levels[2][("the", "cat")][0]
    assert seen > levels[2][("the", "dog")][0]  # "the cat" is counted more often than "the dog"


def test_lm_steers_beam_search_toward_known_words(tmp_path):
    """Acoustically ambiguous emissions ("cat" vs "cap"): the LM picks the word it has seen after "the"."""
    import torch

    from asr.decoding import DecodingOptions, build_decoder
    from asr.tokenizer import train_tokenizer

    tok = train_tokenizer(
        ["the cat sat", "the cap"] * 20, tmp_path / "c.model", vocab_size=12, model_type="char"
    )
    lm = train_lm(["the cat sat"] * 5 + ["a cap"], tmp_path / "lm.arpa", order=2)
    ids = {tok.id_to_piece(i): i for i in range(tok.vocab_size)}
    frames = ["▁", "t", "h", "e", "▁", "c", "a", None]
    lp = torch.full((len(frames) + 1, tok.vocab_size), -9.0)
    for i, piece in enumerate(frames):
        if piece is None:  # "t" and "p" equally likely
            lp[i, ids["t"]] = lp[i, ids["p"]] = math.log(0.5)
        else:
            lp[i, ids[piece]] = 0.0
    lp[-1, 0] = 0.0  # a final blank
    lp = lp.log_softmax(-1)[None]
    lengths = torch.tensor([lp.shape[1]])
    with_lm = build_decoder(DecodingOptions(strategy="beam", beam_size=8, lm=str(lm), lm_weight=2.0), tok)
    assert with_lm.decode(lp, lengths)[0].text == "the cat"
