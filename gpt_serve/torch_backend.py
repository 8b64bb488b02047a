"""The PyTorch backend of the generation engine, and the lesson's full-recompute loop as a reference."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from .engine import window_keep
from .modeling_chargpt import CharGPTForCausalLM
from .sampling import SamplingParams, sample_next


class DecodeLinear(nn.Module):
    """An inference-only `nn.Linear` whose weight is stored transposed, (in, out) and contiguous.

    Decoding multiplies one row by each weight matrix, which is bound by reading the weights from memory; on CPU
    that row-times-(in, out) product streams the matrix about 1.8x faster than `nn.Linear`'s (out, in) layout
    (measured for the lesson-size model's matrices, 2 threads). Same numbers up to float rounding.
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight_t = nn.Parameter(linear.weight.detach().t().contiguous(), requires_grad=False)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])  # (B*T, in)
        out = rows @ self.weight_t if self.bias is None else torch.addmm(self.bias, rows, self.weight_t)
        return out.view(*x.shape[:-1], out.shape[-1])  # (B, T, out)


def decode_copy(model: CharGPTForCausalLM) -> CharGPTForCausalLM:
    """An eval-mode copy of `model` with every `nn.Linear` replaced by a `DecodeLinear`."""
    fast = copy.deepcopy(model).eval()
    for module in list(fast.modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, DecodeLinear(child))
    return fast


class TorchBackend:
    """Runs a `CharGPTForCausalLM` for the engine, with transformers' `DynamicCache` as the cache.

    On CPU the backend decodes with its own copy of the weights in a decode-friendly layout (`decode_copy`), so
    later changes to `model` are not seen; `decode_layout=False` runs `model` itself (put in eval mode).
    Inputs go to the model's device and logits come back as float32 numpy.
    """

    def __init__(self, model: CharGPTForCausalLM, decode_layout: bool = True):
        self.device = next(model.parameters()).device
        self.model = decode_copy(model) if decode_layout and self.device.type == "cpu" else model.eval()
        self.block_size = model.config.block_size
        self.vocab_size = model.config.vocab_size

    @torch.inference_mode()
    def forward(self, input_ids, attention_mask, position_ids, cache):
        out = self.model(
            input_ids=torch.from_numpy(np.ascontiguousarray(input_ids)).to(self.device),
            attention_mask=torch.from_numpy(np.ascontiguousarray(attention_mask)).to(self.device),
            position_ids=torch.from_numpy(np.ascontiguousarray(position_ids)).to(self.device),
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].float().cpu().numpy(), out.cache


@torch.inference_mode()
def full_recompute_generate(
    model: CharGPTForCausalLM,
    prompt: list[int],
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    seed: int | None = None,
    window_mode: str = "exact",
    refill_tokens: int | None = None,
) -> list[int]:
    """The lesson's `generate`: no cache, the whole window re-run for every token. The reference the cached
    paths are tested and benchmarked against; same window semantics and same sampler as the engine."""
    model.eval()
    sampling = sampling or SamplingParams()
    block_size = model.config.block_size
    keep = window_keep(block_size, window_mode, refill_tokens)
    rng = np.random.default_rng(seed)
    device = next(model.parameters()).device
    ids, start = list(prompt), 0
    for _ in range(max_new_tokens):
        if len(ids) - start > block_size:
            start = len(ids) - keep
        x = torch.tensor([ids[start:]], device=device)
        logits = model(input_ids=x, use_cache=False, logits_to_keep=1).logits[:, -1].float().cpu().numpy()
        ids.append(int(sample_next(logits, sampling, rng)[0]))
    return ids[len(prompt) :]
