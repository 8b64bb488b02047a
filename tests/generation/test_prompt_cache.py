"""Prompts kept across requests: a window prefilled before is copied into a new row instead of computed again
(`PromptCache`, kept by the backend), on torch, ONNX (both graphs) and int8.

A window is kept the second time it is prefilled; from the third, the row takes the stored keys, values and logits
(the same numbers, bit for bit), in its place among the other new rows, and decodes on as a prefilled row does; the
scheduler's requests for a prompt seen before make the tokens they make without the cache. The cache holds at most
its bytes, least recently used out first, and refuses a size that is not an int >= 0."""

from __future__ import annotations

import numpy as np
import pytest

from gpt_serve.generation import load_backend
from gpt_serve.generation.backends.onnx_backend import OnnxBackend
from gpt_serve.generation.backends.prompt_cache import DEFAULT_PROMPT_CACHE_BYTES, SEEN_WINDOWS, PromptCache
from gpt_serve.generation.backends.torch_backend import TorchBackend
from tests.conftest import make_tiny_model
from tests.generation.test_fork import choices, run
from tests.generation.test_scheduler import alone

W1, W2, W3 = [5, 17, 33, 2, 40, 9], [1, 2, 3, 4, 5, 6], [7, 7, 60, 7, 7, 7]


@pytest.fixture(params=["torch", "onnx", "onnx-hf-layout", "onnx-int8"])
def backend(request, exported_dir):
    if request.param == "torch":
        return TorchBackend(make_tiny_model())
    inplace = request.param != "onnx-hf-layout"
    return OnnxBackend(exported_dir, quantized=request.param == "onnx-int8", threads=1, inplace=inplace)


def steps(batch, n: int = 4) -> list[np.ndarray]:
    """The logits of `n` decode steps, every row given the same tokens."""
    tokens = np.arange(3, 3 + len(batch), dtype=np.int64)
    return [batch.step(tokens) for _ in range(n)]


def test_a_window_prefilled_again_is_copied_in_and_decodes_as_prefilled(backend):
    backend.prompt_cache = cache = PromptCache()
    first = backend.new_batch(4).add_rows([W1])
    assert len(cache) == 0  # seen once: remembered, not kept
    second = backend.new_batch(4).add_rows([W1])
    assert len(cache) == 1 and cache.hits == 0
    np.testing.assert_array_equal(second, first)

    batch = backend.new_batch(4)
    logits = batch.add_rows([W2, W1, W3])  # the cached window between two that are not
    assert cache.hits == 1 and len(batch) == 3
    np.testing.assert_array_equal(logits[1], second[0])  # the stored logits, bit for bit

    backend.prompt_cache = None  # the same rows, every one prefilled
    plain = backend.new_batch(4)
    expected = plain.add_rows([W2, W1, W3])
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
    for got, want in zip(steps(batch), steps(plain), strict=True):  # each row's cache in its own place
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_batch_of_cached_windows_only_runs_no_forward_pass(backend, monkeypatch):
    backend.prompt_cache = PromptCache()
    for _ in range(2):
        backend.new_batch(2).add_rows([W1, W2])
    passes = []
    for name in ("forward", "run_inplace"):
        if hasattr(backend, name):
            original = getattr(backend, name)
            monkeypatch.setattr(backend, name, lambda *a, _f=original: passes.append(1) or _f(*a))
    batch = backend.new_batch(3)
    batch.add_rows([W2, W1])
    assert passes == [] and backend.prompt_cache.hits == 2
    assert batch.step(np.array([4, 4])).shape == (2, backend.vocab_size)  # and it decodes


@pytest.mark.parametrize("key", ["torch", "onnx-int8"])
def test_requests_for_a_prompt_seen_before_make_the_tokens_they_make_without_it(key, exported_dir):
    """Requests for one prompt, one after another (none admitted with another, so no fork): from the third on, the
    prompt's window comes from the cache, and every request makes the tokens it makes on a backend without one."""
    backend = TorchBackend(make_tiny_model()) if key == "torch" else OnnxBackend(exported_dir, True, threads=1)
    prompt = [5, 17, 33, 2, 40, 9]
    reqs = choices(prompt, 4, 30, window_mode="refill")  # seeds of their own: SEED + j
    expected = [alone(backend, r) for r in reqs]
    backend.prompt_cache = cache = PromptCache()
    got = [run(backend, [r], max_batch=2)[0][0] for r in reqs]
    assert got == expected and cache.hits >= 2
    assert len({tuple(t) for t in got}) > 1


def test_the_cache_keeps_its_bytes_least_recently_used_out_first():
    cache = PromptCache(100)
    for key in [(1,), (2,), (3,)]:
        assert not cache.admit(key) and cache.admit(key)  # kept from the second sighting
        cache.put(key, f"entry {key}", 40)
    assert len(cache) == 2 and cache.bytes == 80 and cache.get((1,)) is None  # (1,) went first
    assert cache.get((2,)) == "entry (2,)"  # now the most recently used
    cache.put((4,), "entry (4,)", 40)
    assert cache.get((3,)) is None and cache.get((2,)) == "entry (2,)" and cache.get((4,)) == "entry (4,)"
    cache.put((5,), "too large", 101)  # larger than the whole cache: not kept, nothing pushed out
    assert cache.get((5,)) is None and len(cache) == 2
    assert (cache.hits, cache.misses) == (3, 3)
    assert "2 prompts" in repr(cache)
    cache.clear()
    assert len(cache) == 0 and cache.bytes == 0 and not cache.admit((2,))


def test_the_windows_seen_once_are_bounded():
    cache = PromptCache()
    for i in range(SEEN_WINDOWS + 1):
        cache.admit((i,))
    assert not cache.admit((0,))  # forgotten: the oldest sighting went out
    assert cache.admit((SEEN_WINDOWS,))


@pytest.mark.parametrize("size", [-1, 1.5, "64", True])
def test_a_cache_size_that_is_not_a_count_of_bytes_is_refused(size):
    with pytest.raises(ValueError, match=r"max_bytes must be an int >= 0, got "):
        PromptCache(size)
    with pytest.raises(ValueError, match=r"max_bytes must be an int >= 0"):
        load_backend("shakespeare", "onnx", threads=1, prompt_cache_bytes=size)


def test_load_backend_gives_every_backend_a_cache_unless_told_not_to():
    loaded = load_backend("shakespeare", "onnx-int8", threads=1)
    assert isinstance(loaded.backend.prompt_cache, PromptCache)
    assert loaded.backend.prompt_cache.max_bytes == DEFAULT_PROMPT_CACHE_BYTES
    assert load_backend("shakespeare", "onnx", threads=1, prompt_cache_bytes=0).backend.prompt_cache is None


def test_what_a_hit_returns_is_the_callers_to_change(backend):
    """Penalties and logit_bias change a row's logits in place: that must not reach the cache's copy."""
    backend.prompt_cache = PromptCache()
    kept = [backend.new_batch(1).add(W1) for _ in range(2)][1].copy()
    for _ in range(2):
        batch = backend.new_batch(3)
        hit = batch.add(W1)
        np.testing.assert_array_equal(hit, kept)
        hit[:] = 0.0
        batch.add_rows([W2, W1])[:] = 0.0
    assert backend.prompt_cache.hits == 4
