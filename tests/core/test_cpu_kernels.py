"""The CPU training kernels in modeling_chargpt: the cheaper dropout mask and the blocked attention with dropout."""

import pytest
import torch
import torch.nn.functional as F

from gpt_serve.modeling_chargpt import (
    Dropout,
    _AttentionWithDropout,
    attention_with_dropout,
    causal_bias,
    dropout_mask,
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
    assert torch.equal(Dropout(1.0).train()(torch.ones(3)), torch.zeros(3))  # nn.Dropout's own p=1 path


def test_dropout_module_keeps_the_expectation_and_is_off_in_eval():
    torch.manual_seed(0)
    module, x = Dropout(0.1), torch.ones(1000, 1000)
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


def test_training_forward_on_cpu_runs_the_kernel(monkeypatch, tiny_model):
    calls = []
    original = _AttentionWithDropout.forward

    def spy(ctx, *args):
        calls.append(args[-1])
        return original(ctx, *args)

    monkeypatch.setattr(_AttentionWithDropout, "forward", staticmethod(spy))
    tiny_model.config.dropout = 0.1
    for block in tiny_model.blocks:
        block.sa.dropout = 0.1
    tiny_model.train()
    x = torch.randint(0, 65, (2, 16))
    loss = tiny_model(x, labels=x, use_cache=False).loss
    loss.backward()
    assert calls == [0.1] * tiny_model.config.n_layer
    assert all(p.grad is not None for p in tiny_model.blocks[0].sa.qkv.parameters())
