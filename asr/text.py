"""Transcript normalization: one function, used by data prep, tokenizer training, training and scoring."""

from __future__ import annotations

import re
import unicodedata

_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'", "`": "'"})
_SEPARATORS = re.compile(r"[-\u2010-\u2015_/]+")  # hyphens, dashes, slashes split words
_NOT_WORD = re.compile(r"[^\w' ]+")  # \w is Unicode-aware: keeps letters of any script and digits
_STRAY_APOSTROPHE = re.compile(r"(?<!\w)'+|'+(?!\w)")  # quotes, not contractions like "don't"
_SPACES = re.compile(r"\s+")


def normalize(text: str) -> str:
    """Lower-case, NFKC, punctuation removed, whitespace collapsed: "Don't—STOP!" -> "don't stop"."""
    text = unicodedata.normalize("NFKC", text).translate(_APOSTROPHES).lower()
    text = _SEPARATORS.sub(" ", text)
    text = _NOT_WORD.sub(" ", text)
    text = _STRAY_APOSTROPHE.sub(" ", text)
    return _SPACES.sub(" ", text).strip()
