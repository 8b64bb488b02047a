"""The lesson's `generate` as a reference: no cache, the whole window re-run for every token. The cached paths
(the scheduler on every backend, transformers' `generate`) are tested, and benchmarked, against it: same window
rule (`gpt_serve.chargpt.window`), same sampler."""

from __future__ import annotations

import numpy as np
import torch

from gpt_serve.chargpt.modeling_chargpt import CharGPTForCausalLM
from gpt_serve.chargpt.window import DEFAULT_WINDOW_MODE, window_keep, window_start
from gpt_serve.generation.sampling import SamplingParams
from tests.sampler import sample_next


@torch.inference_mode()
def full_recompute_generate(
    model: CharGPTForCausalLM,
    prompt: list[int],
    max_new_tokens: int,
    sampling: SamplingParams | None = None,
    seed: int | None = None,
    window_mode: str = DEFAULT_WINDOW_MODE,
    refill_tokens: int | None = None,
) -> list[int]:
    model.eval()
    sampling = sampling or SamplingParams()
    block_size = model.config.block_size
    keep = window_keep(block_size, window_mode, refill_tokens)
    rng = np.random.default_rng(seed)
    device = next(model.parameters()).device
    ids, start = list(prompt), 0
    for _ in range(max_new_tokens):
        start = window_start(len(ids), start, block_size, keep)
        x = torch.tensor([ids[start:]], device=device)
        logits = model(input_ids=x, use_cache=False, logits_to_keep=1).logits[:, -1].float().cpu().numpy()
        ids.append(int(sample_next(logits, sampling, rng)[0]))
    return ids[len(prompt) :]
