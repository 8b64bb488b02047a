"""The PyTorch backend of the generation engine, and the lesson's full-recompute loop as a reference."""

from __future__ import annotations

import numpy as np
import torch

from .engine import window_keep
from .modeling_chargpt import CharGPTForCausalLM
from .sampling import SamplingParams, sample_next


class TorchBackend:
    """Runs a `CharGPTForCausalLM` for the engine, with transformers' `DynamicCache` as the cache.

    The model is put in eval mode; inputs go to the model's device and logits come back as float32 numpy.
    """

    def __init__(self, model: CharGPTForCausalLM):
        self.model = model.eval()
        self.block_size = model.config.block_size
        self.vocab_size = model.config.vocab_size
        self.device = next(model.parameters()).device

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
