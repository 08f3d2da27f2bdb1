"""Helper for tests/test_train.py: one rank of a torchrun DDP run of asr.train, saving its final weights.

torchrun --nnodes=2 --nproc-per-node=1 --node-rank=R ... tests/ddp_train.py key=value ...
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from asr.train import fit, report, shutdown_distributed

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"

if __name__ == "__main__":
    with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
        cfg = OmegaConf.to_object(compose("train", overrides=sys.argv[1:]))
    run_dir = Path(cfg.run_dir)
    trainer, system, dm = fit(cfg, run_dir)
    torch.save(system.model.state_dict(), run_dir / f"weights-rank{trainer.global_rank}.pt")
    report(cfg, run_dir, trainer, system, dm)
    shutdown_distributed()
