"""Corpus adapters: JSONL manifest, LibriSpeech layout, Kaldi data dir, Common Voice TSV -> utterance records.

Every adapter streams one record dict per utterance, shaped like a manifest line::

    {"id": str, "audio": path or URL, "text": str | None, "start"?: s, "end"?: s, "speaker"?: str, "duration"?: s}

``audio`` is resolved against the corpus location, so records can be processed from any working directory.
``text`` is None when the corpus has no transcript for the utterance; a transcript whose bytes are not UTF-8 is
decoded with ``surrogateescape`` so the shard writer can reject it with a reason instead of the reader crashing.
A line that cannot be parsed at all raises ``ManifestError`` naming the file and line.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path

import fsspec

ENCODING = "utf-8"
ERRORS = "surrogateescape"  # keep undecodable bytes so they can be rejected per utterance
JSONL_SUFFIXES = (".jsonl", ".json")
TSV_SUFFIX = ".tsv"
LIBRISPEECH_TRANS_GLOB = "*/*/*.trans.txt"
LIBRISPEECH_AUDIO_SUFFIX = ".flac"
COMMON_VOICE_CLIPS = "clips"
FORMATS = ("auto", "jsonl", "librispeech", "kaldi", "commonvoice")

Record = dict


class ManifestError(ValueError):
    """A manifest line or corpus file that cannot be parsed; the message starts with ``file:line``."""


def read_manifest(path: str | Path, fmt: str = "auto") -> Iterator[Record]:
    """Stream utterance records from a corpus in any supported layout (``fmt="auto"`` detects it)."""
    fmt = detect_format(path) if fmt == "auto" else fmt
    readers = {
        "jsonl": read_jsonl,
        "librispeech": read_librispeech,
        "kaldi": read_kaldi,
        "commonvoice": read_common_voice,
    }
    if fmt not in readers:
        raise ValueError(f"unknown manifest format {fmt!r}; expected one of {FORMATS}")
    return readers[fmt](path)


def detect_format(path: str | Path) -> str:
    """Guess the corpus layout from the path: a file by suffix, a directory by its contents."""
    p = Path(path)
    if p.is_dir():
        if (p / "wav.scp").exists():
            return "kaldi"
        if next(p.glob(LIBRISPEECH_TRANS_GLOB), None) is not None:
            return "librispeech"
        raise ManifestError(f"{p}: directory is neither a Kaldi data dir (wav.scp) nor a LibriSpeech layout")
    if str(p).endswith(TSV_SUFFIX):
        return "commonvoice"
    return "jsonl"


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else "."


def resolve_audio(audio: str, base: str) -> str:
    """Relative audio paths are relative to the manifest's directory; URLs and absolute paths stay as they are."""
    if "://" in audio or audio.startswith("/"):
        return audio
    if "://" in base:
        return f"{base.rstrip('/')}/{audio}"
    return str((Path(base) / audio).resolve())


def _lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line without newline) from a local path or fsspec URL, streamed."""
    with fsspec.open(str(path), "rb") as raw:
        text = io.TextIOWrapper(raw, encoding=ENCODING, errors=ERRORS, newline="")
        for lineno, line in enumerate(text, 1):
            yield lineno, line.rstrip("\r\n")


def read_jsonl(path: str | Path) -> Iterator[Record]:
    """JSONL manifest, one utterance per line; blank lines are skipped."""
    base = _parent(str(path) if "://" in str(path) else str(Path(path).resolve()))
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        yield _parse_jsonl_line(line, base, f"{path}:{lineno}")


def _parse_jsonl_line(line: str, base: str, where: str) -> Record:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ManifestError(f"{where}: not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise ManifestError(f"{where}: expected a JSON object, got {type(row).__name__}")
    for field in ("id", "audio"):
        if not isinstance(row.get(field), str) or not row[field]:
            raise ManifestError(f"{where}: field {field!r} must be a non-empty string")
    for field in ("start", "end", "duration"):
        if field in row and row[field] is not None and not isinstance(row[field], int | float):
            raise ManifestError(f"{where}: field {field!r} must be a number of seconds")
    text = row.get("text")
    record = {"id": row["id"], "audio": resolve_audio(row["audio"], base), "text": text}
    for field in ("start", "end", "duration", "speaker"):
        if row.get(field) is not None:
            record[field] = row[field]
    return record


def read_librispeech(root: str | Path) -> Iterator[Record]:
    """LibriSpeech layout ``SPEAKER/CHAPTER/SPEAKER-CHAPTER.trans.txt`` listing ``UTT-ID TRANSCRIPT`` per line."""
    for trans in sorted(Path(root).glob(LIBRISPEECH_TRANS_GLOB)):
        speaker = trans.parent.parent.name
        for _, line in _lines(trans):
            if not line.strip():
                continue
            utt, _, text = line.partition(" ")
            audio = trans.parent / f"{utt}{LIBRISPEECH_AUDIO_SUFFIX}"
            yield {"id": utt, "audio": str(audio.resolve()), "text": text.strip() or None, "speaker": speaker}


def _kaldi_table(path: Path, required: bool = True) -> dict[str, str]:
    """A Kaldi two-column table ``KEY VALUE...`` -> {key: value}."""
    if not path.exists():
        if required:
            raise ManifestError(f"{path}: missing (required in a Kaldi data dir)")
        return {}
    table = {}
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        key, _, value = line.strip().partition(" ")
        if key in table:
            raise ManifestError(f"{path}:{lineno}: duplicate key {key!r}")
        table[key] = value.strip()
    return table


def _wav_scp_path(entry: str, where: str) -> str:
    """A wav.scp value -> audio path. Simple entries only (a path); pipes (``cmd |``) are not supported."""
    if entry.endswith("|") or not entry:
        raise ManifestError(f"{where}: only plain paths are supported in wav.scp, got {entry!r}")
    return entry


def read_kaldi(data_dir: str | Path) -> Iterator[Record]:
    """Kaldi data dir: ``wav.scp``, ``text``, optional ``segments`` and ``utt2spk``."""
    d = Path(data_dir)
    wavs = {k: _wav_scp_path(v, f"{d / 'wav.scp'}:{k}") for k, v in _kaldi_table(d / "wav.scp").items()}
    texts = _kaldi_table(d / "text")
    spk = _kaldi_table(d / "utt2spk", required=False)
    segments = d / "segments"
    if segments.exists():
        yield from _kaldi_segments(segments, wavs, texts, spk, d)
        return
    for utt, wav in wavs.items():
        yield _kaldi_record(utt, resolve_audio(wav, str(d.resolve())), texts, spk)


def _kaldi_segments(segments: Path, wavs: dict, texts: dict, spk: dict, d: Path) -> Iterator[Record]:
    for lineno, line in _lines(segments):
        if not line.strip():
            continue
        fields = line.split()
        try:
            utt, rec, start, end = fields[0], fields[1], float(fields[2]), float(fields[3])
        except (IndexError, ValueError):
            raise ManifestError(f"{segments}:{lineno}: expected 'UTT RECORDING START END'") from None
        if rec not in wavs:
            raise ManifestError(f"{segments}:{lineno}: recording {rec!r} not in wav.scp")
        record = _kaldi_record(utt, resolve_audio(wavs[rec], str(d.resolve())), texts, spk)
        record.update(start=start, end=end)
        yield record


def _kaldi_record(utt: str, audio: str, texts: dict, spk: dict) -> Record:
    record = {"id": utt, "audio": audio, "text": texts.get(utt)}
    if utt in spk:
        record["speaker"] = spk[utt]
    return record


def read_common_voice(tsv: str | Path) -> Iterator[Record]:
    """Common Voice ``*.tsv`` (columns path, sentence, client_id, ...); audio lives in ``clips/`` beside it."""
    clips = Path(tsv).resolve().parent / COMMON_VOICE_CLIPS
    with open(tsv, encoding=ENCODING, errors=ERRORS, newline="") as f:
        reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        missing = {"path", "sentence"} - set(reader.fieldnames or ())
        if missing:
            raise ManifestError(f"{tsv}:1: header lacks columns {sorted(missing)}")
        for row in reader:
            if None in row or any(v is None for v in row.values()):
                raise ManifestError(f"{tsv}:{reader.line_num}: wrong number of columns")
            clip = row["path"]
            record = {
                "id": clip.rsplit(".", 1)[0],
                "audio": str(clips / clip),
                "text": row["sentence"] or None,
            }
            if row.get("client_id"):
                record["speaker"] = row["client_id"]
            yield record
