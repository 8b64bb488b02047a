"""The window rule: what generation reads once the text outgrows the model's `block_size` learned positions.

The one definition, used by the scheduler (every generation path of this package runs on it) and by
`CharGPTForCausalLM.prepare_inputs_for_generation` (transformers' `generate`). It imports nothing of gpt_serve, so
`save_pretrained` can copy it beside the model file for `trust_remote_code` folders.

The window is the last tokens of the text, at positions `0..len-1`. While the text fits (at most `block_size`
tokens) the window is the whole text and every new token extends the KV cache. When the next token would not fit,
the window restarts from the last `keep` tokens (`window_keep`):

- `"exact"` keeps `block_size` tokens, so every token past the window is a full-window forward without a cache:
  the lesson's `idx[:, -block_size:]`, exactly, and the slowest path;
- `"refill"` (the default) keeps `refill_tokens` (default `block_size // 2`), prefills them again and lets the cache
  grow for the next `block_size - refill_tokens` tokens: many times faster past the window, with different (still
  valid) text from there on.
"""

from __future__ import annotations

WINDOW_MODES = ("exact", "refill")
DEFAULT_WINDOW_MODE = "refill"


def default_refill_tokens(block_size: int) -> int:
    return max(1, block_size // 2)


def window_keep(block_size: int, window_mode: str, refill_tokens: int | None = None) -> int:
    """How many tokens survive when the window overflows; ValueError naming a bad mode or `refill_tokens`."""
    if window_mode not in WINDOW_MODES:
        raise ValueError(f"window_mode must be one of {list(WINDOW_MODES)}, got {window_mode!r}")
    if window_mode == "exact":
        if refill_tokens is not None:
            raise ValueError(f"refill_tokens applies only with window_mode 'refill', got {refill_tokens!r}")
        return block_size
    keep = default_refill_tokens(block_size) if refill_tokens is None else refill_tokens
    if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep < max(2, block_size):
        raise ValueError(
            f"refill_tokens must be an integer in [1, block_size - 1] = [1, {max(1, block_size - 1)}], got {keep!r}"
        )
    return keep


def window_start(length: int, start: int, block_size: int, keep: int) -> int:
    """Where the window of a text of `length` tokens starts, given where it started (`start`): unchanged while
    `length - start` fits in `block_size`, else the last `keep` tokens."""
    return length - keep if length - start > block_size else start
