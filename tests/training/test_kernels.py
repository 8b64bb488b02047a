"""The CPU training kernels (training.kernels): the cheaper dropout mask and the blocked attention with dropout,
and how the trainer switches them in."""

import pytest
import torch
import torch.nn.functional as F
from conftest import make_tiny_model

from gpt_serve import CharGPTForCausalLM
from gpt_serve.chargpt.modeling_chargpt import causal_bias
from training.kernels import (
    CPU_ATTENTION,
    FastDropout,
    _AttentionWithDropout,
    attention_with_dropout,
    dropout_mask,
    use_cpu_training_kernels,
)


def test_dropout_mask_rate_and_scale():
    torch.manual_seed(0)
    drop, scale = dropout_mask((1000, 1000), 0.2, "cpu")
    assert drop.dtype == torch.bool and drop.shape == (1000, 1000)
    assert drop.float().mean().item() == pytest.approx(0.2, abs=2e-3)
    assert scale == pytest.approx(1 / 0.8, rel=1e-4)
    drop, scale = dropout_mask((7, 3), 1e-7, "cpu")  # rounds to 0: nothing is dropped
    assert not drop.any() and scale == 1.0
    with pytest.raises(ValueError, match=r"dropout probability must be in \[0, 1\), got 1.0"):
        dropout_mask((2,), 1.0, "cpu")
    assert torch.equal(FastDropout(1.0).train()(torch.ones(3)), torch.zeros(3))  # nn.Dropout's own p=1 path


def test_dropout_module_keeps_the_expectation_and_is_off_in_eval():
    torch.manual_seed(0)
    module, x = FastDropout(0.1), torch.ones(1000, 1000)
    y = module.train()(x)
    assert (y == 0).float().mean().item() == pytest.approx(0.1, abs=2e-3)
    assert y.mean().item() == pytest.approx(1.0, abs=5e-3)
    assert torch.equal(module.eval()(x), x)


def reference(q, k, v, bias, causal, p):
    """The same blocks and masks (same draws, same order) with plain autograd ops."""
    B, H, T, hs = q.shape
    S = k.shape[2]
    qf, kf, vf = (t.reshape(B * H, t.shape[2], hs) for t in (q, k, v))
    out = q.new_zeros(B * H, T, hs)
    for n, j, s in _AttentionWithDropout.blocks(B * H, T, S, causal):
        scores = qf[n, j] @ kf[n, s].transpose(1, 2) * hs**-0.5
        if bias is not None:
            scores = scores + (bias[n, j, s] if bias.dim() == 3 else bias[j, s])
        drop, scale = dropout_mask(scores.shape, p, scores.device)
        out[n, j] = F.softmax(scores, -1).masked_fill(drop, 0.0) * scale @ vf[n, s]
    return out.view(B, H, T, hs)


@pytest.mark.parametrize("mask", ["causal", "padded", "none"])
def test_attention_with_dropout_matches_autograd_with_the_same_masks(monkeypatch, mask):
    monkeypatch.setattr(_AttentionWithDropout, "CHUNK_ELEMENTS", 2 * 8 * 8)  # several blocks of 2 matrices
    B, H, T, hs = 3, 2, 8, 4
    q, k, v = (torch.randn(B, H, T, hs, dtype=torch.float64, requires_grad=True) for _ in range(3))
    causal = mask == "causal"
    attn_mask, bias = None, causal_bias(T, T, "cpu", torch.float64) if causal else None
    if mask == "padded":
        keys = torch.ones(B, T)
        keys[0, :3] = 0
        attn_mask = causal_bias(T, T, "cpu", torch.float64).masked_fill(keys[:, None, None, :] == 0, -1e4)
        bias = attn_mask.expand(B, H, T, T).reshape(B * H, T, T)
    torch.manual_seed(1)
    y = attention_with_dropout(q, k, v, attn_mask, causal, 0.3)
    grad = torch.randn_like(y)
    got = torch.autograd.grad(y, (q, k, v), grad)
    torch.manual_seed(1)
    y_ref = reference(q, k, v, bias, causal, 0.3)
    want = torch.autograd.grad(y_ref, (q, k, v), grad)
    torch.testing.assert_close(y, y_ref)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_attention_with_nothing_dropped_equals_sdpa():
    q, k, v = (torch.randn(4, 3, 16, 8, requires_grad=True) for _ in range(3))
    y = attention_with_dropout(q, k, v, None, True, 1e-7)  # p rounds to 0
    y_ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    grad = torch.randn_like(y)
    for a, b in zip(torch.autograd.grad(y, (q, k, v), grad), torch.autograd.grad(y_ref, (q, k, v), grad), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_the_attention_takes_the_models_scale():
    """A model with `attn_scale="n_embd"` (gpt.py as typed in the video) trains with its own scale."""
    q, k, v = (torch.randn(2, 3, 16, 8) for _ in range(3))
    y = attention_with_dropout(q, k, v, None, True, 1e-7, scale=24**-0.5)  # p rounds to 0
    torch.testing.assert_close(y, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=24**-0.5))
    assert not torch.allclose(y, F.scaled_dot_product_attention(q, k, v, is_causal=True), atol=1e-3)


def test_training_forward_on_cpu_runs_the_kernel(monkeypatch):
    calls = []
    original = _AttentionWithDropout.forward

    def spy(ctx, *args):
        calls.append(args[-1])
        return original(ctx, *args)

    monkeypatch.setattr(_AttentionWithDropout, "forward", staticmethod(spy))
    model = make_tiny_model(dropout=0.1)
    use_cpu_training_kernels(model)
    assert model.config._attn_implementation == CPU_ATTENTION
    assert all(type(m) is not torch.nn.Dropout for m in model.modules())
    model.train()
    x = torch.randint(0, 65, (2, 16))
    loss = model(x, labels=x, use_cache=False).loss
    loss.backward()
    assert calls == [0.1] * model.config.n_layer
    assert all(p.grad is not None for p in model.model.blocks[0].sa.qkv.parameters())
    calls.clear()
    model.eval()  # evaluation takes SDPA: the same logits as a model without the kernels
    reference = make_tiny_model(dropout=0.1)
    torch.testing.assert_close(model(x).logits, reference(x).logits, rtol=0, atol=1e-6)
    assert calls == []


def test_the_kernels_leave_no_trace_in_a_saved_folder(tmp_path):
    model = make_tiny_model(dropout=0.1)
    use_cpu_training_kernels(model)
    model.save_pretrained(tmp_path)
    assert CPU_ATTENTION not in (tmp_path / "config.json").read_text()
    loaded = CharGPTForCausalLM.from_pretrained(tmp_path)
    assert loaded.config._attn_implementation == "sdpa"
    assert all(type(m) is not FastDropout for m in loaded.modules())


def test_the_trainer_uses_the_kernels_on_cpu_only_when_eager(make_config, tmp_path):
    from training.trainer import Trainer

    trainer = Trainer(make_config(tmp_path / "a", model={"dropout": 0.1}))
    assert trainer.model.config._attn_implementation == CPU_ATTENTION
    trainer = Trainer(make_config(tmp_path / "b", model={"dropout": 0.1}, compile=True))
    assert trainer.model.config._attn_implementation == "sdpa"
