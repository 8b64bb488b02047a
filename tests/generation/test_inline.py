"""The generation engine and the sampler: parity with the lesson's loop, windows, batches, seeds, bad input."""

import numpy as np
import pytest
import torch
from lesson_reference import full_recompute_generate

from gpt_serve.generation.backends.torch_backend import TorchBackend
from gpt_serve.generation.fields import RequestError
from gpt_serve.generation.inline import generate_text, generate_tokens, stream_text
from gpt_serve.generation.sampling import SamplingParams
from gpt_serve.generation.spec import GenerationRequest, parse_request
from tests.sampler import sample_next

GREEDY = SamplingParams(temperature=0)
PROMPT = [18, 47, 56, 57, 58]


def tokens(backend, prompts, n, **kwargs):
    return np.stack(list(generate_tokens(backend, prompts, n, **kwargs)), axis=1)  # (B, n)


@pytest.mark.parametrize("window_mode, refill_tokens", [("exact", None), ("refill", None), ("refill", 3)])
@pytest.mark.parametrize("sampling, seed", [(GREEDY, None), (SamplingParams(1.0, top_k=12, top_p=0.95), 7)])
def test_engine_matches_full_recompute_across_block_size(tiny_model, window_mode, refill_tokens, sampling, seed):
    n = 60  # block_size is 16
    expected = full_recompute_generate(tiny_model, PROMPT, n, sampling, seed, window_mode, refill_tokens)
    got = tokens(
        TorchBackend(tiny_model),
        [PROMPT],
        n,
        sampling=sampling,
        seed=seed,
        window_mode=window_mode,
        refill_tokens=refill_tokens,
    )
    assert got[0].tolist() == expected


def test_refill_differs_from_exact_past_the_window(tiny_model):
    backend = TorchBackend(tiny_model)
    exact = tokens(backend, [PROMPT], 60, sampling=GREEDY, window_mode="exact")
    refill = tokens(backend, [PROMPT], 60, sampling=GREEDY, window_mode="refill")
    assert exact[0, :11].tolist() == refill[0, :11].tolist()  # identical while the text fits in the window
    assert exact.tolist() != refill.tolist()


def test_hf_generate_and_engine_agree(tiny_model):
    for mode in ("exact", "refill"):
        hf = tiny_model.generate(torch.tensor([PROMPT]), max_new_tokens=40, do_sample=False, window_mode=mode)
        assert (
            hf[0, 5:].tolist()
            == tokens(TorchBackend(tiny_model), [PROMPT], 40, sampling=GREEDY, window_mode=mode)[0].tolist()
        )


def test_left_padded_batch_equals_each_prompt_alone(tiny_model):
    backend = TorchBackend(tiny_model)
    prompts = [list(range(1, 15)), [9, 10], [4]]
    batch = tokens(backend, prompts, 40, sampling=GREEDY)
    for row, prompt in zip(batch, prompts):
        assert row.tolist() == tokens(backend, [prompt], 40, sampling=GREEDY)[0].tolist()


def test_stream_concatenation_equals_full_output(tiny_model, tokenizer):
    backend = TorchBackend(tiny_model)
    pieces = list(stream_text(backend, tokenizer.vocab, "ROMEO:", 50, seed=1))
    assert all(len(p) == 1 for p in pieces) and len(pieces) == 50
    assert "".join(pieces) == generate_text(backend, tokenizer.vocab, "ROMEO:", 50, seed=1)


def test_seeds_reproduce_and_differ(tiny_model, tokenizer):
    backend = TorchBackend(tiny_model)
    a = generate_text(backend, tokenizer.vocab, "ROMEO:", 80, seed=5)
    assert a == generate_text(backend, tokenizer.vocab, "ROMEO:", 80, seed=5)
    assert a != generate_text(backend, tokenizer.vocab, "ROMEO:", 80, seed=6)


def test_empty_prompt_starts_from_a_newline(tiny_model, tokenizer):
    backend = TorchBackend(tiny_model)
    assert generate_text(backend, tokenizer.vocab, "", 30, seed=2) == generate_text(
        backend, tokenizer.vocab, "\n", 30, seed=2
    )


def test_stop_strings_end_the_text_before_them(tiny_model, tokenizer):
    backend = TorchBackend(tiny_model)
    free = generate_text(backend, tokenizer.vocab, "ROMEO:", 60, GREEDY)
    stop = free[10:12]
    assert generate_text(backend, tokenizer.vocab, "ROMEO:", 60, GREEDY, stop=stop) == free[: free.index(stop)]
    two = [free[30:33], stop]
    first = min(free.index(s) for s in two)  # the text ends before whichever stop string comes first
    assert generate_text(backend, tokenizer.vocab, "ROMEO:", 60, GREEDY, stop=two) == free[:first]


def test_closing_the_stream_stops_the_compute(tiny_model, tokenizer):
    calls = []
    backend = TorchBackend(tiny_model)
    for name in ("forward", "decode_step"):  # prefills and full windows; decode steps (a one-row loop's batch)
        original = getattr(backend, name)
        setattr(backend, name, lambda *a, original=original: calls.append(1) or original(*a))
    stream = stream_text(backend, tokenizer.vocab, "ROMEO:", 1000)
    for _ in zip(range(5), stream):
        pass
    stream.close()
    assert len(calls) == 5


def test_unknown_characters_in_prompt(tiny_model, tokenizer):
    backend = TorchBackend(tiny_model)
    with pytest.raises(ValueError, match=r"1 character outside this model's vocabulary: '€' \(position 5\)"):
        next(stream_text(backend, tokenizer.vocab, "ROMEO€", 5))
    assert len(generate_text(backend, tokenizer.vocab, "ROMEO€", 5, unk_policy="replace")) == 5
    with pytest.raises(ValueError, match="no character left"):
        next(stream_text(backend, tokenizer.vocab, "€€", 5, unk_policy="drop"))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.5), r"temperature must be a number in \[0, inf\) \(0 = greedy\), got -0.5"),
        (dict(temperature=float("nan")), r"temperature must be a number in \[0, inf\)"),
        (dict(temperature=float("inf")), r"temperature must be a number in \[0, inf\)"),
        (dict(top_p=0.0), r"top_p must be a number in \(0, 1\], got 0"),
        (dict(top_p=1.5), r"top_p must be a number in \(0, 1\]"),
        (dict(top_k=-3), r"top_k must be an integer in \[0, inf\) \(0 = no limit\), got -3"),
        (dict(repetition_penalty=0), r"repetition_penalty must be a number in \[0.01, inf\)"),
        (dict(presence_penalty=2.5), r"presence_penalty must be a number in \[-2, 2\]"),
    ],
)
def test_bad_sampling_params_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_the_engine_takes_what_only_the_wire_refuses():
    """The engine's bounds are its own: a library caller may sample at temperature 2.5 (top_k 2,000,000, a
    repetition_penalty of 20); a request parsed from what a user sent is held to OpenAI's ranges."""
    hot = SamplingParams(temperature=2.5, top_k=2_000_000, repetition_penalty=20.0)
    assert (hot.temperature, hot.top_k, hot.repetition_penalty) == (2.5, 2_000_000, 20.0)
    assert GenerationRequest("ROMEO:", 5, sampling=hot).sampling is hot
    for field, value in (("temperature", 2.5), ("top_k", 2_000_000), ("repetition_penalty", 20.0)):
        with pytest.raises(RequestError, match=rf"{field} must be (a number|an integer) in \[[0-9.]+, [0-9]+\]"):
            GenerationRequest("ROMEO:", 5, **{field: value})
        with pytest.raises(RequestError, match=field):
            parse_request({"prompt": "ROMEO:", field: value})


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(max_new_tokens=0), ValueError, r"max_new_tokens must be an integer in \[1, 100000\], got 0"),
        (dict(max_new_tokens=10**400), ValueError, r"max_new_tokens must be an integer in \[1, 100000\], got 1000"),
        (dict(max_new_tokens=2.5), ValueError, r"max_new_tokens must be an integer in \[1, 100000\], got 2.5"),
        (dict(seed=-4), ValueError, r"seed must be an integer in \[0, 9007199254740991\]"),
        (dict(window_mode="slide"), ValueError, "window_mode must be one of"),
        (dict(window_mode="refill", refill_tokens=16), ValueError, r"refill_tokens must be .* = \[1, 15\], got 16"),
        (dict(prompt=123), ValueError, "prompt must be text, got int"),
        (dict(stop=["a"] * 5), ValueError, "stop must be a string or a list of at most 4 non-empty strings"),
    ],
)
def test_bad_arguments_are_named(tiny_model, tokenizer, kwargs, error, message):
    args = dict(prompt="ROMEO:", max_new_tokens=5)
    args.update(kwargs)
    with pytest.raises(error, match=message):
        next(stream_text(TorchBackend(tiny_model), tokenizer.vocab, **args))


def test_bad_prompt_ids(tiny_model):
    backend = TorchBackend(tiny_model)
    with pytest.raises(ValueError, match="prompt 1: the prompt is empty"):
        next(generate_tokens(backend, [[1], []], 3))
    with pytest.raises(ValueError, match=r"the prompt holds ids \[99\] outside the vocabulary \[0, 64\]"):
        next(generate_tokens(backend, [[1, 99]], 3))


def test_sampler_temperature_zero_is_argmax_and_filters_apply():
    rng = np.random.default_rng(0)
    logits = np.array([[0.0, 3.0, 1.0, 2.0]])
    assert sample_next(logits, SamplingParams(0), rng).tolist() == [1]
    top1 = SamplingParams(1.0, top_k=1)
    assert {int(sample_next(logits, top1, rng)[0]) for _ in range(50)} == {1}
    nucleus = SamplingParams(1.0, top_p=0.7)  # p = [.03, .64, .09, .24]: keeps tokens 1 and 3
    assert {int(sample_next(logits, nucleus, rng)[0]) for _ in range(300)} == {1, 3}
    draws = [int(sample_next(logits, SamplingParams(1.0), rng)[0]) for _ in range(4000)]
    freq = np.bincount(draws, minlength=4) / 4000
    np.testing.assert_allclose(freq, np.exp(logits[0]) / np.exp(logits[0]).sum(), atol=0.03)


def test_decode_linear_matches_linear_and_shares_its_weight():
    from gpt_serve.generation.backends.torch_decode import DecodeLinear

    torch.manual_seed(0)
    for bias in (True, False):
        linear = torch.nn.Linear(16, 24, bias=bias)
        assert DecodeLinear(linear).max_rows == 0  # oneDNN's kernel at every row count, by default
        fast = DecodeLinear(linear, chunks=4, max_rows=8)
        assert fast.weight is linear.weight and fast.chunks == 4
        for rows in (1, 3, 8, 20):  # the batched path for few rows, oneDNN's kernel past max_rows
            x = torch.randn(rows, 1, 16)
            torch.testing.assert_close(fast(x), linear(x), rtol=0, atol=1e-5)
            torch.testing.assert_close(DecodeLinear(linear)(x), linear(x), rtol=0, atol=1e-5)
    assert DecodeLinear(torch.nn.Linear(16, 65), chunks=4).chunks == 1  # 65 rows do not split into 4 blocks
    strided = torch.nn.Linear(16, 24)
    strided.weight = torch.nn.Parameter(torch.randn(16, 24).t())  # (24, 16), not contiguous: no view into blocks
    fast = DecodeLinear(strided, chunks=4)
    assert fast.chunks == 1
    x = torch.randn(1, 1, 16)
    torch.testing.assert_close(fast(x), strided(x), rtol=0, atol=1e-5)


def test_torch_backend_decodes_through_a_copy_that_shares_the_weights(tiny_model):
    from gpt_serve.generation.backends.torch_decode import DecodeLinear

    backend = TorchBackend(tiny_model)
    assert isinstance(backend.model.lm_head, DecodeLinear)
    assert type(tiny_model.lm_head) is torch.nn.Linear  # the caller's model is left alone
    assert backend.model.lm_head.weight is tiny_model.lm_head.weight  # ... and its weights are not copied
    ids = np.array([[18, 47, 56, 57, 58]])
    mask, positions = np.ones_like(ids), np.arange(5)[None]
    fast, _ = backend.forward(ids, mask, positions, None)
    plain, _ = TorchBackend(tiny_model, decode_layout=False).forward(ids, mask, positions, None)
    np.testing.assert_allclose(fast, plain, rtol=0, atol=1e-5)


def test_torch_backend_cache_errors(tiny_model):
    backend = TorchBackend(tiny_model)
    ids = np.array([[18, 47, 56]])
    mask, positions = np.ones_like(ids), np.arange(3)[None]
    _, cache = backend.forward(ids, mask, positions, None)
    with pytest.raises(ValueError, match="the cache holds a batch of 1 rows, input_ids has 2"):
        backend.forward(np.ones((2, 1), dtype=np.int64), np.ones((2, 4), dtype=np.int64), np.full((2, 1), 3), cache)
    ids, mask = np.ones((1, 14), dtype=np.int64), np.ones((1, 17), dtype=np.int64)
    with pytest.raises(ValueError, match="the KVBuffer holds 16 positions, 17 were given"):
        backend.forward(ids, mask, np.arange(14)[None], cache)


def reference_tokens(fake, prompt, n, window_mode="exact", refill_tokens=None):
    """The window semantics written out, on the fake's own logits: the lesson's `idx[:, -block_size:]` for exact,
    a restart from the last `refill_tokens` for refill, greedy."""
    keep = fake.block_size if window_mode == "exact" else (refill_tokens or fake.block_size // 2)
    ids, start = list(prompt), 0
    for _ in range(n):
        if len(ids) - start > fake.block_size:
            start = len(ids) - keep
        window = np.array([ids[start:]])
        ids.append(int(fake.logits_of(window, np.ones_like(window)).argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("window_mode, refill_tokens", [("exact", None), ("refill", None), ("refill", 3)])
def test_the_engine_keeps_the_window_semantics_on_a_fake_backend(fake, window_mode, refill_tokens):
    prompt = [1, 2, 3]
    got = tokens(fake, [prompt], 30, sampling=GREEDY, window_mode=window_mode, refill_tokens=refill_tokens)
    assert got[0].tolist() == reference_tokens(fake, prompt, 30, window_mode, refill_tokens)
    if window_mode == "exact":  # past the window every step is a full-window forward
        assert fake.calls[-1] == (0, fake.block_size)
    else:  # a refill, then cheap steps
        assert (0, refill_tokens or 4) in fake.calls and fake.calls[-1][1] == 1


def test_a_fake_left_padded_batch_equals_each_prompt_alone(fake):
    prompts = [[1, 2, 3, 4, 5], [6], [7, 8]]
    batch = tokens(fake, prompts, 20, sampling=GREEDY, window_mode="exact")
    for row, prompt in zip(batch, prompts, strict=True):
        assert row.tolist() == reference_tokens(fake, prompt, 20)


def test_the_fake_engine_stops_and_seeds(fake):
    free = tokens(fake, [[1, 2]], 20, sampling=GREEDY)[0].tolist()
    stop = free[5]
    stopped = tokens(fake, [[1, 2]], 20, sampling=GREEDY, stop_token_ids=[stop])[0].tolist()
    assert stopped == free[: free.index(stop) + 1]
    with pytest.raises(ValueError, match=r"max_new_tokens must be an integer in \[1, 100000\], got 0"):
        next(generate_tokens(fake, [[1]], 0))
    sampled = [tokens(fake, [[3]], 25, sampling=SamplingParams(2.0), seed=s)[0].tolist() for s in (1, 1, 2)]
    assert sampled[0] == sampled[1] != sampled[2]
