"""python -m asr.train: config groups, kill -9 and exact resume, two-node DDP on uneven shards, sweeps."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from asr.bundle import load_bundle
from asr.train import TrainConfig, convergence_step
from serve.try_api import free_port

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
PYTHON = sys.executable
TINY_RUN = [  # a very small model and batches of one or two utterances, one thread per process
    "data=tiny",
    "model.d_model=64",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.subsampling_channels=4",
    "model.subsampling_factor=4",  # the test tokenizer's 64 pieces are too dense for 8x on short clips
    "data.max_frames_per_batch=500",
    "data.num_workers=1",
    "trainer.num_threads=1",
    "trainer.enable_progress_bar=false",
    "trainer.log_every_n_steps=2",
]
TIMEOUT_S = 120


def _data_args(shards: dict, train_dir: Path | None = None) -> list[str]:
    return [
        f"data.train_dir={train_dir or shards['train']}",
        f"data.val_dir={shards['dev']}",
        f"data.tokenizer={shards['tokenizer']}",
    ]


def _compose(overrides: list[str]) -> TrainConfig:
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return OmegaConf.to_object(compose("train", overrides=overrides))


def _shard_keys(shard_dir: Path) -> Counter:
    import tarfile

    keys = Counter()
    for tar in sorted(shard_dir.glob("*.tar")):
        with tarfile.open(tar) as t:
            keys.update({m.name.split(".")[0] for m in t.getmembers()})
    return keys


def _read_keys(path: Path) -> list[tuple[int, int, int, str]]:
    rows = [line.split("\t") for line in path.read_text().splitlines()]
    return [(int(step), int(epoch), int(wrap), key) for step, epoch, wrap, key in rows]


def _reached_step(keys: Path, step: int) -> bool:
    lines = keys.read_text().splitlines()[:-1] if keys.exists() else []  # the last may be partly written
    return any(int(line.split("\t")[0]) >= step for line in lines)


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


@pytest.mark.parametrize("group", ["data", "model", "trainer", "optim"])
def test_every_config_group_option_composes(group):
    options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    assert options
    for option in options:
        cfg = _compose([f"{group}={option}", "data.train_dir=a", "data.val_dir=b", "data.tokenizer=c"])
        assert isinstance(cfg, TrainConfig)
    large = _compose(["model=large", "data.train_dir=a", "data.val_dir=b", "data.tokenizer=c"])
    assert large.model.activation_checkpointing and large.model.d_model == 1024


def test_config_typos_and_bad_values_fail_at_start_up():
    with pytest.raises(ConfigCompositionException):
        _compose(["model.d_modle=64"])
    with pytest.raises(ConfigCompositionException):
        _compose(["model=huge"])
    with pytest.raises(ValueError, match="encoder"):
        _compose(["model.encoder=lstm", "data.train_dir=a", "data.val_dir=b", "data.tokenizer=c"])


def test_convergence_step_is_the_first_within_one_percent_of_the_minimum():
    history = [{"step": s, "loss": v} for s, v in [(10, 5.0), (20, 2.0), (30, 1.005), (40, 1.0), (50, 1.2)]]
    assert convergence_step(history) == 30
    assert convergence_step([]) is None


def test_kill9_mid_epoch_then_resume_sees_each_utterance_once(tiny_shards, tmp_path):
    run = tmp_path / "run"
    args = [PYTHON, "-m", "asr.train", *TINY_RUN, *_data_args(tiny_shards), f"run_dir={run}"]
    args += [
        "trainer.max_epochs=1",
        "data.steps_per_epoch=24",
        "trainer.checkpoint_every_n_steps=4",
        "record_keys=true",
    ]
    first = subprocess.Popen(
        args, cwd=tmp_path, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + TIMEOUT_S
    while not _reached_step(run / "keys-rank0.tsv", 9):  # past the end of step 8 and its checkpoint
        assert first.poll() is None and time.monotonic() < deadline, first.stderr.read().decode()[-3000:]
        time.sleep(0.02)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    saved_step = torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    assert 8 <= saved_step < 24  # killed mid-epoch
    (run / "keys-rank0.tsv").rename(run / "killed.tsv")

    subprocess.run(args, cwd=tmp_path, env=_env(), check=True, capture_output=True, timeout=TIMEOUT_S)
    killed = [r for r in _read_keys(run / "killed.tsv") if r[0] < saved_step]  # later steps were redone
    resumed = _read_keys(run / "keys-rank0.tsv")
    assert resumed[0][0] == saved_step  # continues from the saved step
    assert sorted({r[0] for r in killed + resumed}) == list(range(24))
    real = Counter(key for _, epoch, wrap, key in killed + resumed if wrap == 0 and epoch == 0)
    assert real == _shard_keys(tiny_shards["train"])  # every utterance exactly once, none skipped
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 24 and summary["epochs"] == 1 and summary["best_val_loss"] is not None
    assert summary["audio_hours_seen"] > 0 and summary["throughput_audio_s_per_s"] > 0
    assert load_bundle(run / "bundle.pt").extra["summary"]["steps"] == 24
    assert not list(tmp_path.glob("outputs")) and not (tmp_path / ".hydra").exists()  # cwd not littered


def _three_shard_dir(shards: dict, out: Path) -> Path:
    """The first 3 of the 4 train shards: a count the 2 ranks cannot share evenly."""
    index = json.loads((shards["train"] / "index.json").read_text())
    index["shards"] = index["shards"][:3]
    index["utterances"] = sum(s["utterances"] for s in index["shards"])
    out.mkdir()
    for s in index["shards"]:
        shutil.copy(shards["train"] / s["name"], out / s["name"])
    shutil.copy(shards["train"] / "cmvn.json", out / "cmvn.json")
    (out / "index.json").write_text(json.dumps(index))
    return out


def test_two_node_ddp_on_uneven_shards(tiny_shards, tmp_path):
    train_dir = _three_shard_dir(tiny_shards, tmp_path / "train3")
    run = tmp_path / "run"
    port = free_port()
    config = [*TINY_RUN, *_data_args(tiny_shards, train_dir), f"run_dir={run}", "record_keys=true"]
    config += ["trainer.strategy=ddp", "trainer.num_nodes=2", "trainer.process_group_backend=gloo"]
    config += ["trainer.max_epochs=1", "trainer.checkpoint_every_n_steps=1000", "data.num_workers=0"]
    config += ["data.steps_per_epoch=10"]  # rank 0 has 8 utterances, rank 1 has 4 and wraps
    logs = [tmp_path / f"node{rank}.log" for rank in range(2)]
    torchrun = [PYTHON, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
    torchrun += ["--master-addr=127.0.0.1", f"--master-port={port}"]
    procs = [
        subprocess.Popen(
            [*torchrun, f"--node-rank={rank}", str(ROOT / "tests" / "ddp_train.py"), *config],
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=logs[rank].open("w"),
            start_new_session=True,  # the agent and its worker are killed together
        )
        for rank in range(2)
    ]
    try:
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    except subprocess.TimeoutExpired:
        codes = None
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
    tails = "".join(f"\n--- node {r} ---\n" + logs[r].read_text()[-3000:] for r in range(2))
    assert codes == [0, 0], tails

    keys = [_read_keys(run / f"keys-rank{r}.tsv") for r in range(2)]
    steps = [sorted({row[0] for row in k}) for k in keys]
    assert steps[0] == steps[1] and len(steps[0]) > 1  # same number of steps on both ranks: no hang
    real = [Counter(key for _, _, wrap, key in k if wrap == 0) for k in keys]
    assert not set(real[0]) & set(real[1])  # disjoint shards
    assert real[0] + real[1] == _shard_keys(train_dir)
    weights = [torch.load(run / f"weights-rank{r}.pt") for r in range(2)]
    for name, w in weights[0].items():
        torch.testing.assert_close(w, weights[1][name], rtol=0, atol=0, msg=name)
    assert sorted(p.name for p in (run / "checkpoints").glob("*.ckpt")) == ["best.ckpt", "last.ckpt"]
    assert json.loads((run / "summary.json").read_text())["world_size"] == 2


def test_multirun_sweep_writes_one_run_per_value(tiny_shards, tmp_path):
    sweep = tmp_path / "sweep"
    args = [PYTHON, "-m", "asr.train", "-m", "optim.lr=0.001,0.003", *TINY_RUN, *_data_args(tiny_shards)]
    args += [f"run_dir={sweep}", "trainer.max_steps=2", "data.steps_per_epoch=2", "data.num_workers=0"]
    subprocess.run(args, cwd=tmp_path, env=_env(), check=True, capture_output=True, timeout=TIMEOUT_S)
    for job, lr in [("0", 0.001), ("1", 0.003)]:
        assert json.loads((sweep / job / "summary.json").read_text())["steps"] == 2
        assert load_bundle(sweep / job / "bundle.pt").extra["run_dir"] == str(sweep / job)
        assert f"optim.lr={lr}" in (sweep / job / ".hydra" / "overrides.yaml").read_text()
