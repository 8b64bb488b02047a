"""Logprobs held compactly: the same entries as tuples of Python floats, ~12 bytes for each top one, and a stream
that has sent its entries forgets them."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from gpt_serve.generation import SamplingParams
from gpt_serve.generation.requests import Request
from gpt_serve.generation.runner import InlineRunner
from gpt_serve.generation.scheduler import Scheduler
from gpt_serve.generation.token_logprobs import TokenLogprobs

from .conftest import FakeBackend


def held(entries: list) -> TokenLogprobs:
    out = TokenLogprobs(2)
    for e in entries:
        if e is None:
            out.append_none()
        else:
            out.append(e[0], np.array([t for t, _ in e[1]]), np.array([lp for _, lp in e[1]]))
    return out


ENTRIES = [None, (-0.5, [(3, -0.25), (1, -2.0)]), (-1e-300, [(0, -1e-300), (7, -700.125)])]


def test_entries_read_back_as_they_were_given():
    logprobs = held(ENTRIES)
    assert len(logprobs) == 3 and logprobs == ENTRIES and list(logprobs) == ENTRIES
    assert logprobs[1:] == ENTRIES[1:] and logprobs[-1] == ENTRIES[-1] and logprobs[:0] == []
    assert logprobs.nbytes == 3 * (8 + 2 * 12)
    assert isinstance(logprobs[1][1][0][0], int) and isinstance(logprobs[1][0], float)


def test_released_entries_keep_the_indices_of_the_others_and_cannot_be_read():
    logprobs = held(ENTRIES)
    logprobs.release(2)
    assert len(logprobs) == 3 and logprobs[2] == ENTRIES[2] and logprobs[2:] == ENTRIES[2:]
    assert logprobs.nbytes == 8 + 2 * 12
    with pytest.raises(IndexError, match="entry 1 is not held"):
        logprobs[1]
    with pytest.raises(IndexError, match="entries before 2 are not held"):
        logprobs[0:3]
    logprobs.release(1)  # already gone: nothing changes
    assert logprobs[2:] == ENTRIES[2:]


def test_a_stream_with_20_logprobs_a_token_holds_a_few_hundred_bytes_a_token():
    """The issue's ~3 KB a token (RSS 207 -> 598 MB for n=16 x 8000): 2,000 tokens with 20 top logprobs each, as the
    engine keeps them, take under 600 bytes a token of the Python heap (the arrays' 248 and their growth)."""
    scheduler = Scheduler(FakeBackend(), max_batch=1, runner=InlineRunner())
    request = Request([1], 2_000, SamplingParams(0.8), seed=0, window_mode="refill", logprobs=20)
    try:
        list(scheduler.submit(Request([1], 50, logprobs=20)))  # whatever imports on first use, before the count
        tracemalloc.start()
        stream = scheduler.submit(request)
        tokens = list(stream)
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        scheduler.close()
    assert len(tokens) == len(stream.logprobs) == 2_000
    assert stream.logprobs.nbytes == 2_000 * (8 + 20 * 12)  # (the fake's 11 ids are all top ones)
    assert all(len(top) == 11 for _, top in stream.logprobs)
    assert size < 2_000 * 600, f"{size / 2_000:.0f} bytes a token"
