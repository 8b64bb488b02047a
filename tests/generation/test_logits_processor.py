"""`model.generate(...)` under a constraint (`StructuredOutputs`): the same automaton, the same text as the engine."""

from __future__ import annotations

import re

import pytest
import torch

from gpt_serve.generation import RequestError, SamplingParams, generate_text, load_backend
from gpt_serve.generation.logits_processor import StructuredOutputs

REGEX = r"[A-Z]{2,5}:\n[a-z ]{2,6}\."


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_backend(str(tiny_model_dir), "torch", threads=1)


def test_greedy_generate_gives_the_engines_text(loaded, tokenizer):
    ids = torch.tensor([tokenizer.encode("RO")])
    constraint = StructuredOutputs(tokenizer, structured_outputs={"regex": REGEX})
    out = loaded.backend.pretrained.generate(
        ids,
        do_sample=False,
        max_new_tokens=14,
        logits_processor=[constraint],
        stopping_criteria=[constraint.stopping_criteria()],
    )
    text = tokenizer.decode(out[0, 2 : constraint.end_of(out[0])].tolist())
    assert re.fullmatch(REGEX, text)
    engine = generate_text(
        loaded.backend, loaded.vocab, "RO", 14, SamplingParams(0), structured_outputs={"regex": REGEX}
    )
    assert text == engine


def test_sampled_rows_of_a_batch_each_match_up_to_their_end(loaded, tokenizer):
    ids = torch.tensor([tokenizer.encode("ROMEO:")] * 4)
    constraint = StructuredOutputs(tokenizer, structured_outputs={"choice": ["Ay.", "No, my lord."]})
    torch.manual_seed(0)
    out = loaded.backend.pretrained.generate(
        ids,
        do_sample=True,
        max_new_tokens=20,
        logits_processor=[constraint],
        stopping_criteria=[constraint.stopping_criteria()],
    )
    for row in out:
        assert tokenizer.decode(row[6 : constraint.end_of(row)].tolist()) in ("Ay.", "No, my lord.")


GRAMMAR = 'start: NAME ":\\n" WORDS "."\nNAME: /[A-Z]{2,5}/\nWORDS: /[a-z ]{2,6}/\n'  # REGEX, in Lark


def test_a_grammar_gives_the_engines_text_and_each_sampled_row_follows_it(loaded, tokenizer):
    constraint = StructuredOutputs(tokenizer, structured_outputs={"grammar": GRAMMAR})
    out = loaded.backend.pretrained.generate(
        torch.tensor([tokenizer.encode("RO")]),
        do_sample=False,
        max_new_tokens=14,
        logits_processor=[constraint],
        stopping_criteria=[constraint.stopping_criteria()],
    )
    text = tokenizer.decode(out[0, 2 : constraint.end_of(out[0])].tolist())
    engine = generate_text(
        loaded.backend, loaded.vocab, "RO", 14, SamplingParams(0), structured_outputs={"grammar": GRAMMAR}
    )
    assert text == engine and re.fullmatch(REGEX, text)
    constraint = StructuredOutputs(tokenizer, structured_outputs={"grammar": GRAMMAR})
    torch.manual_seed(1)
    out = loaded.backend.pretrained.generate(
        torch.tensor([tokenizer.encode("ROMEO:")] * 3),
        do_sample=True,
        max_new_tokens=20,
        logits_processor=[constraint],
        stopping_criteria=[constraint.stopping_criteria()],
    )
    assert out.shape[1] < 26  # every row ended before max_new_tokens
    for row in out:
        assert re.fullmatch(REGEX, tokenizer.decode(row[6 : constraint.end_of(row)].tolist()))


def test_bad_constraints_are_refused_by_name(tokenizer):
    with pytest.raises(RequestError, match="structured_outputs.regex: the regex is malformed"):
        StructuredOutputs(tokenizer, structured_outputs={"regex": "a("})
    with pytest.raises(RequestError, match="structured_outputs.grammar: the grammar is malformed or unsupported"):
        StructuredOutputs(tokenizer, structured_outputs={"grammar": "start: foo"})
    with pytest.raises(ValueError, match="give structured_outputs"):
        StructuredOutputs(tokenizer)
