"""Progress of a shard job: a tqdm bar (utterances/s, audio hours/s, ETA) and the final summary."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

from data_prep.shards import ShardResult

SECONDS_PER_HOUR = 3600.0


class Progress:
    """Counts finished shards; ``total_utterances`` and ``total_hours`` come from the plan (estimates)."""

    def __init__(self, total_utterances: int, total_hours: float, enabled: bool = True):
        self.start = time.perf_counter()
        self.enabled = enabled
        self.total_hours = total_hours
        self.utterances = self.rejects = self.shards = self.skipped = 0
        self.seconds = 0.0
        self.written_seconds = 0.0  # audio featurized by this run (skipped shards excluded)
        self._bar = tqdm(
            total=total_utterances,
            unit="utt",
            desc="sharding",
            disable=not enabled,
            file=sys.stderr,
            dynamic_ncols=True,
        )

    def update(self, result: ShardResult) -> None:
        self.shards += 1
        self.skipped += int(result.skipped)
        self.utterances += result.utterances
        self.rejects += len(result.rejects)
        self.seconds += result.seconds
        self.written_seconds += 0.0 if result.skipped else result.seconds
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        self._bar.set_postfix(
            audio_h_per_s=f"{self.written_seconds / SECONDS_PER_HOUR / elapsed:.3g}",
            hours=f"{self.seconds / SECONDS_PER_HOUR:.2f}/{self.total_hours:.2f}",
            rejects=self.rejects,
            refresh=False,
        )
        self._bar.update(result.utterances + len(result.rejects))

    def close(self) -> dict:
        """Stops the bar; returns the summary (utterances, hours, shards, rejects, wall time, throughput)."""
        self._bar.close()
        wall = time.perf_counter() - self.start
        hours = self.seconds / SECONDS_PER_HOUR
        written = self.written_seconds / SECONDS_PER_HOUR
        summary = {
            "utterances": self.utterances,
            "hours": hours,
            "shards": self.shards,
            "shards_skipped": self.skipped,
            "rejects": self.rejects,
            "wall_seconds": wall,
            "hours_written": written,
            "audio_hours_per_second": written / wall if wall > 0 else 0.0,
        }
        if self.enabled:
            print(format_summary(summary), file=sys.stderr)
        return summary


def format_summary(s: dict) -> str:
    """One line a person reads at the end of a job."""
    return (
        f"sharded {s['utterances']} utterances ({s['hours']:.3f} h) into {s['shards']} shards "
        f"({s['shards_skipped']} already complete), {s['rejects']} rejected, in {s['wall_seconds']:.1f} s: "
        f"{s['audio_hours_per_second']:.4f} audio h/s"
    )
