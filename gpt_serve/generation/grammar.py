"""Grammars (`structured_outputs.grammar`, Lark or EBNF) and `json_object` over a character vocabulary: a
`GrammarAutomaton` with the interface of `constraints.CharAutomaton` (`walk`, `advance`, `is_final`, `masks`), whose
states are llguidance matchers, one per row, that compute each step's mask with their parser (a context-free grammar
has no finite table; docs/structured.md). The grammar was checked in the compile worker first (`compile_grammar`),
so a malformed or hostile one never reaches this process. numpy and llguidance only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .compile_worker import dead_end, grammar_mask, grammar_tokenizer

__all__ = ["GrammarAutomaton", "GrammarState"]


class GrammarState:
    """A row's place in a grammar: its llguidance matcher and, once computed, the mask of what may follow."""

    __slots__ = ("matcher", "mask", "ids")

    def __init__(self, matcher):
        self.matcher = matcher
        self.ids: list[int] = []  # the tokens consumed (to name what a dead end lacks)
        self.mask: np.ndarray | None = None  # (V,) bool, after the tokens consumed so far


class GrammarAutomaton:
    """A checked llguidance grammar over the vocabulary `chars`, only the ids where `vocab_mask` is set allowed. Each
    `walk` from the start makes a new matcher (a row's own state); `advance` moves it in place."""

    def __init__(
        self, grammar: str, chars: Sequence[str], vocab_mask: np.ndarray, constraint, others: Sequence[str] = ()
    ):
        import llguidance

        self._new = lambda: llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        self._tokenizer = grammar_tokenizer(list(chars))
        self.grammar = grammar
        self.chars = list(chars)
        self.vocab_mask = vocab_mask  # (V,) bool
        self.constraint = constraint
        self.vocab_size = len(chars)
        self.others = tuple(others)  # characters beside the vocabulary's that a dead end's message may name

    def walk(self, ids: Sequence[int], state: GrammarState | None = None) -> GrammarState:
        """The state after `ids` from `state` (None: a new one at the start; a given one is moved in place);
        ValueError at a token not allowed."""
        state = GrammarState(self._new()) if state is None else state
        for i, token in enumerate(ids):
            if not (0 <= token < self.vocab_size and self.vocab_mask[token]) or not state.matcher.consume_token(token):
                raise ValueError(f"token {i} (id {token}) is not allowed by the grammar there")
            state.ids.append(token)
            state.mask = None
        return state

    def advance(self, state: GrammarState, token: int) -> GrammarState:
        """`state` after the sampled `token` (which its mask allowed), in place."""
        state.matcher.consume_token(token)
        state.ids.append(token)
        state.mask = None
        return state

    def mask(self, state: GrammarState) -> np.ndarray:
        """What may follow in `state`: (V,) bool. ValueError when the matcher failed (a limit of llguidance's)."""
        if state.mask is None:
            mask = grammar_mask(state.matcher, self._tokenizer, self.vocab_size) & self.vocab_mask
            if dead_end(state.matcher):
                mask[:] = False  # (`masks` names what it lacks)
            elif state.matcher.is_error():
                reason = state.matcher.get_error().split("\n", 1)[0]
                raise ValueError(f"{self.constraint.source}: the grammar's parser failed: {reason}")
            state.mask = mask
        return state.mask

    def is_final(self, state: GrammarState) -> bool:
        """Whether the text so far is accepted and nothing may follow (the row ends there, "stop"). False where the
        parser failed (the next step's `masks` says why)."""
        try:
            return not self.mask(state).any() and state.matcher.is_accepting()
        except ValueError:
            return False

    def masks(self, states: Sequence[GrammarState]) -> np.ndarray:
        """Each state's mask: (k, V) bool. ValueError for a state with nothing to write (a dead end: the grammar
        goes on only with characters the vocabulary lacks), naming what the grammar wanted there."""
        return np.stack([self._live_mask(s) for s in states])

    def _live_mask(self, state: GrammarState) -> np.ndarray:
        mask = self.mask(state)
        if not mask.any():
            raise ValueError(self._dead_end(state))
        return mask

    def _dead_end(self, state: GrammarState) -> str:
        """The message for a row the grammar lets go on only with characters this vocabulary (or allowed_token_ids)
        lacks, naming those it could have written there (among the vocabulary's and `others`)."""
        import llguidance

        every = self.chars + [c for c in self.others if c not in set(self.chars)]
        tokenizer = grammar_tokenizer(every)
        wide = llguidance.LLMatcher(tokenizer, self.grammar, log_level=0)
        wide.consume_tokens(state.ids)  # the same ids: the vocabulary comes first in `every`
        wanted = [every[i] for i in np.flatnonzero(grammar_mask(wide, tokenizer, len(every)))]
        missing = [c for i, c in enumerate(every) if c in wanted and not (i < self.vocab_size and self.vocab_mask[i])]
        return (
            f"{self.constraint.source}: the grammar goes on after {_characters(len(state.ids))} only with characters "
            f"this model's vocabulary cannot write: {' '.join(map(repr, missing)) or 'none it knows'}"
        )


def _characters(n: int) -> str:
    return f"{n} character" + ("" if n == 1 else "s")
