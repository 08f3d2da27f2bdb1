"""ASRSystem: float32 CTC under autocast, bf16-mixed on CPU, LR schedule, and a tiny model overfitting speech."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader

from asr.data import PipelineOptions, ShardStream, StreamPosition, read_cmvn, read_index
from asr.model import ASRModel, ModelConfig, ctc_log_probs, ctc_loss
from asr.system import ASRSystem, OptimConfig, lr_factor
from asr.tokenizer import Tokenizer

TINY = dict(encoder="transformer", d_model=96, num_layers=2, num_heads=2, subsampling_channels=8, dropout=0.0)


@pytest.fixture(autouse=True)
def one_thread():
    # NOTE: the test machine's cores are shared; more threads than free cores makes torch far slower
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def speech_batch(tiny_shards):
    """One batch of the 4 utterances of the first train shard, with the tokenizer and CMVN."""
    index = read_index(str(tiny_shards["train"]))
    tokenizer = Tokenizer(tiny_shards["tokenizer"])
    stream = ShardStream(
        index["shards"][:1], tokenizer, PipelineOptions(max_frames_per_batch=10**6, shuffle_buffer=0)
    )
    batch = next(iter(stream.batches(StreamPosition())))
    assert len(batch["keys"]) == 4
    return batch, tokenizer, read_cmvn(str(tiny_shards["train"]))


def _trainer(steps: int, precision: str = "32-true") -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        precision=precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        gradient_clip_val=5.0,
        num_sanity_val_steps=0,
    )


def _repeat(batch: dict, n: int) -> DataLoader:
    return DataLoader([batch] * n, batch_size=None)


def _system(batch_tokenizer_cmvn, lr=3e-3, warmup=10) -> ASRSystem:
    _, tokenizer, (mean, std) = batch_tokenizer_cmvn
    torch.manual_seed(0)
    system = ASRSystem(
        ModelConfig(vocab_size=tokenizer.vocab_size, **TINY),
        OptimConfig(lr=lr, warmup_steps=warmup, schedule="constant"),
        tokenizer,
    )
    system.model.set_cmvn(mean, std)
    return system


def test_log_softmax_and_ctc_run_in_float32_under_bf16_autocast():
    model = ASRModel(ModelConfig(vocab_size=20, **TINY))
    feats, lens = torch.randn(2, 120, 80), torch.tensor([120, 90])
    targets, target_lens = torch.randint(1, 20, (2, 6)), torch.tensor([6, 4])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, out_lens = model(feats, lens)
        log_probs = ctc_log_probs(logits)
        loss = ctc_loss(logits, out_lens, targets, target_lens)
    assert logits.dtype == torch.bfloat16  # the encoder did run in bf16
    assert log_probs.dtype == loss.dtype == torch.float32
    reference = ctc_loss(logits.float(), out_lens, targets, target_lens)  # no autocast at all
    torch.testing.assert_close(loss, reference)
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_bf16_mixed_training_runs_on_cpu(speech_batch):
    system = _system(speech_batch)
    before = [p.detach().clone() for p in system.model.parameters()]
    losses = []
    system.on_train_batch_end = lambda outputs, batch, idx: losses.append(outputs["loss"].detach())
    _trainer(3, "bf16-mixed").fit(system, train_dataloaders=_repeat(speech_batch[0], 3))
    assert len(losses) == 3 and all(loss.dtype == torch.float32 and torch.isfinite(loss) for loss in losses)
    assert any(not torch.equal(a, b) for a, b in zip(before, system.model.parameters(), strict=True))


def test_tiny_model_overfits_a_few_utterances(speech_batch):
    batch, tokenizer, _ = speech_batch
    system = _system(speech_batch)
    losses = []
    system.on_train_batch_end = lambda outputs, b, idx: losses.append(float(outputs["loss"]))
    trainer = _trainer(150)
    trainer.fit(system, train_dataloaders=_repeat(batch, 150))
    assert losses[-1] < 0.05 * losses[0]
    metrics = trainer.validate(system, dataloaders=_repeat(batch, 1), verbose=False)[0]
    assert metrics["val/wer"] == 0.0 and metrics["val/cer"] == 0.0  # greedy decoding reproduces the text
    assert system.val_history[-1]["wer"] == 0.0


def test_lr_warms_up_then_decays():
    noam = OptimConfig(lr=1.0, warmup_steps=10, schedule="noam")
    factors = [lr_factor(s, noam, 0) for s in range(100)]
    assert factors[0] < factors[5] < factors[9] == 1.0 > factors[20] > factors[99] > 0
    cosine = OptimConfig(lr=1.0, warmup_steps=10, schedule="cosine", min_lr_ratio=0.1)
    assert lr_factor(9, cosine, 100) == 1.0 and lr_factor(100, cosine, 100) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="schedule"):
        OptimConfig(schedule="linear")
