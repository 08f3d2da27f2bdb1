"""Word n-gram language model (ARPA) from the training transcripts, for CTC beam search.

    python -m data_prep.lm input=MANIFEST_OR_SHARD_DIR out=lm.arpa [order=3 discount=0.7]

A backoff model with absolute discounting, written in the ARPA format that KenLM and flashlight read. It needs no
external tool (KenLM's ``lmplz`` is not on PyPI); for a large text corpus, build the ARPA file with ``lmplz``
instead and pass it the same way (``decoding=beam decoding.lm=FILE``).
"""

from __future__ import annotations

import math
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from asr.text import normalize

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
NO_PROB = -99.0  # ARPA's log10 probability for <s>, which is never predicted
UNK_FRACTION = 1e-4  # probability mass held back for unseen words


def count_ngrams(sentences: Iterable[str], order: int) -> list[Counter]:
    """counts[k] maps (k+1)-word tuples to counts, sentences padded with <s> and </s>."""
    counts = [Counter() for _ in range(order)]
    for sentence in sentences:
        words = [BOS, *sentence.split(), EOS]
        for k in range(order):
            for i in range(len(words) - k):
                gram = tuple(words[i : i + k + 1])
                if gram != (BOS,):  # <s> is a context, never a predicted word
                    counts[k][gram] += 1
    return counts


def estimate(counts: list[Counter], discount: float) -> tuple[list[dict], list[dict]]:
    """(log10 probs per order, log10 backoff weights per order) of a backoff absolute-discounting model."""
    total = sum(counts[0].values())
    probs = [{g: (1 - UNK_FRACTION) * c / total for g, c in counts[0].items()}]
    probs[0][(UNK,)] = UNK_FRACTION
    backoffs: list[dict] = []
    for k in range(1, len(counts)):
        ctx_total: Counter = Counter()
        followers: dict[tuple, list[tuple]] = defaultdict(list)
        for g, c in counts[k].items():
            ctx_total[g[:-1]] += c
            followers[g[:-1]].append(g)
        probs.append({g: (c - discount) / ctx_total[g[:-1]] for g, c in counts[k].items()})
        weights = {}
        for ctx, grams in followers.items():
            seen = sum(probs[k][g] for g in grams)
            lower = sum(_prob(probs, backoffs, g[1:]) for g in grams)
            weights[ctx] = (1 - seen) / max(1e-12, 1 - lower)
        backoffs.append(weights)
    logp = [{g: math.log10(p) for g, p in level.items()} for level in probs]
    logb = [{g: math.log10(w) for g, w in level.items()} for level in backoffs]
    return logp, logb


def _prob(probs: list[dict], backoffs: list[dict], gram: tuple) -> float:
    """p(gram[-1] | gram[:-1]) from the orders estimated so far, backing off as needed."""
    k = len(gram) - 1
    if k < len(probs) and gram in probs[k]:
        return probs[k][gram]
    if k == 0:
        return probs[0][(UNK,)]
    weight = backoffs[k - 1].get(gram[:-1], 1.0) if k - 1 < len(backoffs) else 1.0
    return weight * _prob(probs, backoffs, gram[1:])


def write_arpa(path: str | Path, logp: list[dict], logb: list[dict]) -> Path:
    """Write the model as an ARPA file (atomically)."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    unigrams = {**logp[0], (BOS,): NO_PROB}
    levels = [unigrams, *logp[1:]]
    with tmp.open("w", encoding="utf-8") as f:
        f.write("\\data\\\n" + "".join(f"ngram {k + 1}={len(level)}\n" for k, level in enumerate(levels)))
        for k, level in enumerate(levels):
            f.write(f"\n\\{k + 1}-grams:\n")
            for gram in sorted(level):
                line = f"{level[gram]:.6f}\t{' '.join(gram)}"
                if k < len(logb) and gram in logb[k]:
                    line += f"\t{logb[k][gram]:.6f}"
                f.write(line + "\n")
        f.write("\n\\end\\\n")
    tmp.replace(path)
    return path


def train_lm(sentences: Iterable[str], out: str | Path, order: int = 3, discount: float = 0.7) -> Path:
    """Normalize ``sentences``, estimate an ``order``-gram backoff model, write it as ARPA to ``out``."""
    if order < 1 or not 0 < discount < 1:
        raise ValueError(f"need order >= 1 and 0 < discount < 1, got order={order} discount={discount}")
    counts = count_ngrams((t for t in map(normalize, sentences) if t), order)
    if not counts[0]:
        raise ValueError("no text to train a language model on")
    return write_arpa(out, *estimate(counts, discount))


def main(argv: list[str]) -> int:
    from data_prep.tokenizer import corpus_texts

    args = dict(a.split("=", 1) for a in argv)
    if not {"input", "out"} <= set(args) or set(args) - {"input", "out", "order", "discount"}:
        print(__doc__, file=sys.stderr)
        return 2
    out = train_lm(
        corpus_texts(args["input"]), args["out"], int(args.get("order", 3)), float(args.get("discount", 0.7))
    )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
