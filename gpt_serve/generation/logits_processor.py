"""Structured outputs for `model.generate(...)`: a transformers `LogitsProcessor` over the same character automaton
the engine masks by (`constraints`), and the `StoppingCriteria` that ends a row where the automaton accepts with
nothing to follow.

    constraint = StructuredOutputs(tokenizer, structured_outputs={"regex": "[A-Z]+:\\n[a-z ,]+\\."})
    out = model.generate(ids, logits_processor=[constraint], stopping_criteria=[constraint.stopping_criteria()],
                         do_sample=True, max_new_tokens=100)

The processor masks the scores it is given, after transformers' own processors before it in the list (put it last:
then temperature, top-k and top-p see only allowed characters, as in the engine; transformers applies its warpers
after processors, so with sampling they act on the masked scores either way). Rows that end early in a batch go on
with unconstrained tokens until the last ends (the model has no padding token to fill them with): cut each row
at `end_of(row_ids)`. One processor per `generate` call (it takes the first input it sees as the prompt; making
another is cheap: compiled automata are cached). Imports torch and transformers.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import LogitsProcessor, StoppingCriteria

from .constraints import CharAutomaton, compile_constraint
from .grammar import GrammarAutomaton
from .spec import parse_request

__all__ = ["StructuredOutputs"]


class StructuredOutputs(LogitsProcessor):
    """The constraint of `structured_outputs` (vLLM's: regex, choice, json, json_object), `response_format`
    (OpenAI's) and/or `allowed_token_ids` over `tokenizer`'s vocabulary (a `CharTokenizer`, or its `CharVocab`);
    every field checked, and compiled, as a server does (a `RequestError` names what is wrong)."""

    def __init__(self, tokenizer, structured_outputs=None, response_format=None, allowed_token_ids=None):
        request = parse_request(
            {
                "structured_outputs": structured_outputs,
                "response_format": response_format,
                "allowed_token_ids": allowed_token_ids,
            }
        )
        chars = getattr(tokenizer, "vocab", tokenizer).chars
        automaton = compile_constraint(request.constraint, chars, request.allowed_token_ids)
        if automaton is None:
            raise ValueError("give structured_outputs, a JSON response_format or allowed_token_ids")
        self.automaton: CharAutomaton | GrammarAutomaton = automaton
        self._prompt_length: int | None = None  # the first call's input length: what follows is generated
        # each batch row's generated ids so far and its state after them (None once ended), carried from call to
        # call so that a grammar's matcher moves one token a step
        self._rows: dict[int, tuple[list[int], Any]] = {}

    def states(self, input_ids: torch.LongTensor) -> list:
        """Each row's state after its generated tokens (None: it has ended, accepted with nothing to follow)."""
        if self._prompt_length is None:
            self._prompt_length = input_ids.shape[1]
        return [self._state(b, row[self._prompt_length :].tolist()) for b, row in enumerate(input_ids)]

    def _state(self, b: int, generated: list[int]):
        seen, state = self._rows.get(b, (None, None))
        if seen is None or generated[: len(seen)] != seen:  # not this row's continuation: from the start
            seen, state = [], self._unless_final(self.automaton.walk([]))
        for token in generated[len(seen) :]:
            if state is None:  # ended: what follows is not constrained
                break
            state = self._unless_final(self.automaton.advance(state, token))
        self._rows[b] = (generated, state)
        return state

    def _unless_final(self, state):
        return None if self.automaton.is_final(state) else state

    def end_of(self, row: torch.LongTensor) -> int:
        """Where the constrained text of `row` (prompt and generated ids) ends: its length if it has not."""
        assert self._prompt_length is not None, "call generate first"
        state = self.automaton.walk([])
        for i, token in enumerate(row[self._prompt_length :].tolist()):
            try:
                state = self.automaton.walk([token], state)
            except ValueError:
                return self._prompt_length + i + 1
            if self.automaton.is_final(state):
                return self._prompt_length + i + 1
        return len(row)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        states = self.states(input_ids)
        allowed = torch.ones_like(scores, dtype=torch.bool)
        live = [b for b, s in enumerate(states) if s is not None]
        if live:
            masks = self.automaton.masks([states[b] for b in live])  # (k, V)
            allowed[live] = torch.from_numpy(masks).to(scores.device)
        return scores.masked_fill(~allowed, float("-inf"))

    def stopping_criteria(self) -> StoppingCriteria:
        """The criteria that end a row once its automaton accepts with nothing to follow."""
        return _Ended(self)


class _Ended(StoppingCriteria):
    def __init__(self, processor: StructuredOutputs):
        self.processor = processor

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        return torch.tensor([s is None for s in self.processor.states(input_ids)], device=input_ids.device)
