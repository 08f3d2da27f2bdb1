"""ASRModel and model bundle: shapes, padding invariance, CMVN inside the model, bundle round trip."""

from __future__ import annotations

import pytest
import torch

from asr.audio import FBANK_16K
from asr.bundle import load_bundle, save_bundle
from asr.model import ASRModel, ModelConfig, subsampled_lengths
from asr.tokenizer import train_tokenizer

TINY = dict(d_model=32, num_layers=2, num_heads=2, subsampling_channels=4, conv_kernel=5, dropout=0.0)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    texts = ["the quick brown fox", "jumps over the lazy dog", "hello world"] * 20
    return train_tokenizer(texts, tmp_path_factory.mktemp("tok") / "t.model", vocab_size=30)


@pytest.mark.parametrize("encoder", ["transformer", "conformer"])
def test_forward_shapes_and_subsampled_lengths(encoder):
    model = ASRModel(ModelConfig(encoder=encoder, vocab_size=11, **TINY)).eval()
    lens = torch.tensor([203, 150, 7])
    logits, out_lens = model(torch.randn(3, 203, 80), lens)
    assert logits.shape == (3, int(out_lens.max()), 11)
    assert out_lens.tolist() == [50, 36, 1]  # ((T - 1) // 2 - 1) // 2
    assert torch.equal(out_lens, subsampled_lengths(lens))


@pytest.mark.parametrize("encoder", ["transformer", "conformer"])
def test_padding_does_not_change_real_outputs(encoder):
    model = ASRModel(ModelConfig(encoder=encoder, **TINY)).eval()
    model.set_cmvn(torch.randn(80), torch.rand(80) + 0.5)
    short = torch.randn(1, 60, 80)
    padded = torch.cat([short, torch.randn(1, 40, 80) * 100], dim=1)  # garbage in the padding
    alone, n = model(short, torch.tensor([60]))
    batched, m = model(padded, torch.tensor([60]))
    assert n.item() == m.item() == 14
    torch.testing.assert_close(batched[:, :14], alone, rtol=1e-4, atol=1e-4)


def test_cmvn_is_applied_inside_the_model():
    model = ASRModel(ModelConfig(**TINY)).eval()
    x, lens = torch.randn(2, 50, 80), torch.tensor([50, 50])
    mean, std = torch.full((80,), 3.0), torch.full((80,), 2.0)
    reference, _ = model(x, lens)
    model.set_cmvn(mean, std)
    shifted, _ = model(x * std + mean, lens)  # raw features that CMVN maps back to x
    torch.testing.assert_close(shifted, reference, rtol=1e-4, atol=1e-4)


def test_invalid_config_fails_at_construction():
    with pytest.raises(ValueError, match="encoder"):
        ModelConfig(encoder="lstm")
    with pytest.raises(ValueError, match="divisible"):
        ModelConfig(d_model=100, num_heads=3)


def test_activation_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = ASRModel(ModelConfig(**TINY))
    ckpt = ASRModel(ModelConfig(**TINY, activation_checkpointing=True))
    ckpt.load_state_dict(plain.state_dict())
    x, lens = torch.randn(2, 80, 80), torch.tensor([80, 64])
    for m in (plain, ckpt):
        m(x, lens)[0].square().mean().backward()
    for (name, a), b in zip(plain.named_parameters(), ckpt.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, msg=name)


def test_bundle_round_trip_is_self_contained(tmp_path, tokenizer):
    model = ASRModel(ModelConfig(vocab_size=tokenizer.vocab_size, **TINY))
    model.set_cmvn(torch.randn(80), torch.rand(80) + 0.5)
    path = save_bundle(tmp_path / "bundle.pt", model, FBANK_16K, tokenizer, extra={"steps": 7})
    torch.load(path, weights_only=True)  # plain types and tensors only
    bundle = load_bundle(path)
    assert not bundle.model.training
    assert bundle.feature == FBANK_16K and bundle.model_config == model.cfg and bundle.extra == {"steps": 7}
    assert bundle.tokenizer.decode(bundle.tokenizer.encode("hello world")) == "hello world"
    x, lens = torch.randn(1, 90, 80), torch.tensor([90])
    torch.testing.assert_close(bundle.model(x, lens)[0], model.eval()(x, lens)[0], rtol=0, atol=0)


def test_bundle_rejects_mismatched_tokenizer(tmp_path, tokenizer):
    model = ASRModel(ModelConfig(vocab_size=tokenizer.vocab_size + 1, **TINY))
    with pytest.raises(ValueError, match="vocab"):
        save_bundle(tmp_path / "b.pt", model, FBANK_16K, tokenizer)


@pytest.mark.parametrize("encoder", ["transformer", "conformer"])
def test_8x_subsampling_halves_output_frames_and_ignores_padding(encoder):
    model = ASRModel(ModelConfig(encoder=encoder, vocab_size=11, subsampling_factor=8, **TINY)).eval()
    lens = torch.tensor([203, 150, 15])
    logits, out_lens = model(torch.randn(3, 203, 80), lens)
    assert out_lens.tolist() == [24, 18, 1]  # frame pairs, then ((T - 1) // 2 - 1) // 2
    assert torch.equal(out_lens, subsampled_lengths(lens, 8)) and logits.shape == (3, 24, 11)
    short = torch.randn(1, 61, 80)  # odd length: the last frame has no pair
    padded = torch.cat([short, torch.randn(1, 40, 80) * 100], dim=1)
    alone, n = model(short, torch.tensor([61]))
    batched, m = model(padded, torch.tensor([61]))
    assert n.item() == m.item() == 6
    assert torch.allclose(alone, batched[:, : n.item()], atol=1e-4)


def test_subsampling_factor_is_checked():
    with pytest.raises(ValueError, match="subsampling_factor"):
        ModelConfig(subsampling_factor=6)
