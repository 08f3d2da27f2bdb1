"""python -m asr.evaluate on tiny shards and manifests: the reported figures match an independent count."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import make_tiny_bundle

from asr.evaluate import EvaluateConfig, evaluate
from asr.text import normalize

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory, sentences_file) -> Path:
    return make_tiny_bundle(tmp_path_factory.mktemp("bundle"), sentences_file)


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Plain Levenshtein distance over words (the independent count)."""
    prev = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        cur = [i]
        for j, h in enumerate(hyp, start=1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h)))
        prev = cur
    return prev[-1]


def read_report(out_dir: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((out_dir / "summary.json").read_text())
    rows = [json.loads(line) for line in (out_dir / "utterances.jsonl").open()]
    return summary, rows


def check_report(summary: dict, rows: list[dict], refs: dict[str, str]) -> None:
    """WER equals an independent count over the reported hypotheses; rows are worst first."""
    assert {r["key"] for r in rows} == set(refs)
    errors = [edit_distance(normalize(refs[r["key"]]).split(), r["hyp"].split()) for r in rows]
    words = sum(len(normalize(refs[r["key"]]).split()) for r in rows)
    assert [r["errors"] for r in rows] == errors
    assert summary["wer"] == pytest.approx(sum(errors) / words)
    assert summary["substitutions"] + summary["deletions"] + summary["insertions"] == sum(errors)
    assert summary["ref_words"] == words and summary["utterances"] == len(rows)
    assert errors == sorted(errors, reverse=True)
    assert 0 < summary["rtf"] < 10 and summary["audio_seconds"] > 0


def test_evaluate_shards_reports_wer_equal_to_an_independent_count(
    bundle_path, tiny_shards, speech_corpus, tmp_path
):
    shard_dir = tiny_shards["dev"]
    index = json.loads((shard_dir / "index.json").read_text())
    summary = evaluate(EvaluateConfig(model=str(bundle_path), data=str(shard_dir), out_dir=str(tmp_path)))
    _, rows = read_report(tmp_path)
    assert len(rows) == index["utterances"] > 0
    source = {r["id"]: r["text"] for r in map(json.loads, speech_corpus["dev"].open(encoding="utf-8"))}
    check_report(
        summary, rows, {r["key"]: source[r["key"]] for r in rows}
    )  # references from the corpus itself
    assert summary["skipped"] == 0


def test_cli_on_a_manifest_with_beam_search_skips_unreadable_audio(bundle_path, speech_corpus, tmp_path):
    src = speech_corpus["dev"]
    lines = [json.loads(line) for line in src.open(encoding="utf-8")]
    for row in lines:
        row["audio"] = str(src.parent / row["audio"])
    broken = {"id": "broken", "audio": str(tmp_path / "missing.wav"), "text": "never heard"}
    manifest = tmp_path / "dev.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in [*lines, broken]), encoding="utf-8")
    out_dir = tmp_path / "report"
    cmd = [
        sys.executable, "-m", "asr.evaluate", f"model={bundle_path}", f"data={manifest}",
        f"out_dir={out_dir}", "decoding=beam", "decoding.beam_size=4",
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "WER" in proc.stdout and "RTF" in proc.stdout
    summary, rows = read_report(out_dir)
    check_report(summary, rows, {r["id"]: r["text"] for r in lines})
    assert summary["skipped"] == 1 and summary["decoding"]["strategy"] == "beam"
    assert set(tmp_path.iterdir()) == {manifest, out_dir}  # Hydra left nothing in the working directory


def test_cli_rejects_unknown_keys(bundle_path, tmp_path):
    cmd = [sys.executable, "-m", "asr.evaluate", f"model={bundle_path}", "data=x", "batchsize=3"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "batchsize" in proc.stderr
