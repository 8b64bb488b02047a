"""Structured outputs for a character vocabulary: a `Constraint` (a regex, choices, a JSON schema) compiled to a
character automaton over a model's vocabulary (`CharAutomaton`), whose per-state masks are a precomputed table, so
that a decode step costs one table lookup per row (`rows.next_tokens`).

Every token is one character, so the constraint's character DFA *is* the token mask: no walk over multi-character
tokens, no token healing. interegular compiles the regex (outlines-core writes a schema's regex) in a worker process
(`compile_worker`, bounded in time and memory); the automaton is then restricted here to the vocabulary (and a
request's `allowed_token_ids`) and pruned to the states from which an accepted text can still be written, so a row
never walks into a dead end. A grammar and `json_object` are no finite automata: llguidance checks them in the same
worker, and each row masks by its own parser (`grammar.GrammarAutomaton`, the same interface). Compiled automata are
cached per (constraint, vocabulary, allowed ids). numpy (and llguidance) only.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from .compile_worker import CompileError, Unwritable, compile_dfa, compile_grammar
from .fields import RequestError
from .grammar import GrammarAutomaton
from .structured import Constraint

__all__ = ["CharAutomaton", "compile_constraint", "constraint_job"]

# constraints with no finite automaton in general, compiled by llguidance and masked by its parser per step (`grammar`)
GRAMMAR_KINDS = ("grammar", "json_object")

# characters a constraint's DFA is built over besides the vocabulary's and its own: what a constraint may need that
# a vocabulary lacks is named from these (printable ASCII, tab and newline)
BASE_ALPHABET = tuple(chr(c) for c in range(32, 127)) + ("\t", "\n")
CACHE_SIZE = 128


class CharAutomaton:
    """A constraint over a vocabulary: `next_state[s, t]` is the state after token t from state s (-1: t is not
    allowed there), `allowed` the same as a mask (S, V), `accepting[s]` whether the text so far is accepted, and
    `final[s]` whether it is accepted with no continuation (the row ends there, "stop")."""

    def __init__(self, next_state: np.ndarray, initial: int, accepting: np.ndarray, constraint: Constraint | None):
        self.next_state = next_state  # (S, V) int32
        self.allowed = next_state >= 0  # (S, V) bool
        self.initial = initial
        self.accepting = accepting  # (S,) bool
        self.final = accepting & ~self.allowed.any(axis=1)  # (S,) bool
        self.constraint = constraint
        self.vocab_size = next_state.shape[1]

    @property
    def n_states(self) -> int:
        return self.next_state.shape[0]

    def advance(self, state: int, token: int) -> int:
        """The state after `token` (which `allowed[state]` allowed): a table lookup."""
        return int(self.next_state[state, token])

    def is_final(self, state: int) -> bool:
        return bool(self.final[state])

    def masks(self, states: Sequence[int]) -> np.ndarray:
        """What may follow in each of `states`: (k, V) bool, a gather from the table."""
        return self.allowed[states]

    def walk(self, ids: Sequence[int], state: int | None = None) -> int:
        """The state after `ids` from `state` (None: the initial one); ValueError at a token not allowed."""
        state = self.initial if state is None else state
        for i, token in enumerate(ids):
            nxt = int(self.next_state[state, token])
            if nxt < 0:
                raise ValueError(f"token {i} (id {token}) is not allowed by the constraint there")
            state = nxt
        return state


def constraint_job(constraint: Constraint) -> tuple[str, str, str]:
    """What the worker compiles to a DFA: (kind, text, end): "regex" and a regex, or "schema" and a schema's JSON,
    then `end` (a regex) allowed after it. (A grammar and `json_object` go to llguidance instead: `GRAMMAR_KINDS`.)"""
    end = f"(?:{_literal(constraint.end)})?" if constraint.end else ""
    if constraint.kind == "choice":
        return "regex", "|".join(_literal(c) for c in constraint.value), end
    if constraint.kind == "json":
        return "schema", constraint.value, end
    return "regex", constraint.value, end


def _literal(text: str) -> str:
    """`text` as a regex matching itself."""
    return re.escape(text)


_CACHE: OrderedDict = OrderedDict()
_CACHE_LOCK = threading.Lock()


def compile_constraint(
    constraint: Constraint | None, chars: Sequence[str], allowed_ids: Sequence[int] | None = None
) -> CharAutomaton | GrammarAutomaton | None:
    """The automaton of `constraint` over the vocabulary `chars` (id order), only `allowed_ids` allowed (None: all);
    None when there is neither. Cached. RequestError naming the request field for a malformed or unsupported
    constraint, one too large or too slow to compile, ids outside the vocabulary, or a constraint the vocabulary
    cannot write (naming the characters it lacks)."""
    if constraint is None and allowed_ids is None:
        return None
    key = (constraint, tuple(chars), None if allowed_ids is None else tuple(allowed_ids))
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    mask = np.ones(len(chars), dtype=bool)
    if allowed_ids is not None:
        bad = [t for t in allowed_ids if t >= len(chars)]
        if bad:
            raise RequestError(f"allowed_token_ids holds ids outside this model's vocabulary of {len(chars)}: "
                               f"{bad[:10]}", "allowed_token_ids")  # fmt: skip
        mask[:] = False
        mask[list(allowed_ids)] = True
    if constraint is None:  # one state, every allowed id loops on it
        automaton = CharAutomaton(np.where(mask, 0, -1).astype(np.int32)[None, :], 0, np.ones(1, bool), None)
    elif constraint.kind in GRAMMAR_KINDS:
        automaton = _compile_grammar(constraint, list(chars), mask)
    else:
        automaton = _compile(constraint, list(chars), mask)
    with _CACHE_LOCK:
        _CACHE[key] = automaton
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    return automaton


def _compile(constraint: Constraint, chars: list[str], mask: np.ndarray) -> CharAutomaton:
    kind, text, end = constraint_job(constraint)
    own = set(text) if kind == "regex" else set()
    alphabet = tuple(sorted(set(BASE_ALPHABET) | set(chars) | own | set(constraint.end)))
    try:
        dfa = compile_dfa(kind, text, alphabet, end)
    except CompileError as e:
        raise RequestError(f"{constraint.source}: {e}", constraint.field) from None
    column = np.array([alphabet.index(c) for c in chars])
    table = np.where(mask[None, :], dfa.table[:, column], -1)  # (S, V): the vocabulary's moves only
    useful = _useful(table, dfa.initial, dfa.accepting)
    if not useful[dfa.initial]:
        raise RequestError(_unwritable(constraint, dfa, set(np.asarray(chars)[mask].tolist())), constraint.field)
    number = np.cumsum(useful) - 1  # old state -> new state
    kept = table[useful]  # (S', V)
    kept = np.where(kept >= 0, np.where(useful[np.maximum(kept, 0)], number[np.maximum(kept, 0)], -1), -1)
    return CharAutomaton(kept.astype(np.int32), int(number[dfa.initial]), dfa.accepting[useful], constraint)


def _compile_grammar(constraint: Constraint, chars: list[str], mask: np.ndarray) -> GrammarAutomaton:
    others = tuple(c for c in BASE_ALPHABET if c not in set(chars))
    try:
        grammar = compile_grammar(constraint.kind, constraint.value, tuple(chars), tuple(mask.tolist()), others,
                                  constraint.end)  # fmt: skip
    except Unwritable as e:
        raise RequestError(f"{constraint.source}: this model's vocabulary cannot write the first character of any "
                           f"text the grammar accepts: it lacks the characters {_shown(e.missing)}",
                           constraint.field) from None  # fmt: skip
    except CompileError as e:
        raise RequestError(f"{constraint.source}: {e}", constraint.field) from None
    return GrammarAutomaton(grammar, chars, mask, constraint, others)


def _useful(table: np.ndarray, initial: int, accepting: np.ndarray) -> np.ndarray:
    """The states reachable from `initial` through `table` (S, A) from which an accepting state can be reached."""
    src, sym = np.nonzero(table >= 0)
    dst = table[src, sym]
    reach = _closure(np.array([initial]), src, dst, table.shape[0])
    back = _closure(np.flatnonzero(accepting & reach), dst, src, table.shape[0])
    return reach & back


def _closure(start: np.ndarray, src: np.ndarray, dst: np.ndarray, n: int) -> np.ndarray:
    """The states reached from `start` along the edges src -> dst (breadth first, a frontier at a time)."""
    order = np.argsort(src, kind="stable")
    src, dst = src[order], dst[order]
    bounds = np.searchsorted(src, np.arange(n + 1))
    seen = np.zeros(n, dtype=bool)
    seen[start] = True
    frontier = start
    while frontier.size:
        nxt = np.concatenate([dst[bounds[s] : bounds[s + 1]] for s in frontier]) if frontier.size else frontier
        nxt = np.unique(nxt)
        frontier = nxt[~seen[nxt]]
        seen[frontier] = True
    return seen


def _unwritable(constraint: Constraint, dfa, have: set[str]) -> str:
    """The message for a constraint no text of the vocabulary satisfies: the characters it uses that the
    vocabulary lacks (on the moves of its automaton that can lead to an accepted text)."""
    useful = _useful(dfa.table, dfa.initial, dfa.accepting)
    moves = (dfa.table >= 0) & useful[:, None] & useful[np.maximum(dfa.table, 0)]
    used = [dfa.alphabet[a] for a in np.flatnonzero(moves.any(axis=0))]
    missing = [c for c in used if c not in have]
    return (f"{constraint.source}: this model's vocabulary cannot write any text the constraint accepts: it lacks "
            f"the characters {_shown(missing)}")  # fmt: skip


def _shown(missing: list[str]) -> str:
    """Characters for a message: the first 40, and how many more."""
    more = f" and {len(missing) - 40} more" if len(missing) > 40 else ""
    return (" ".join(repr(c) for c in missing[:40]) + more) or "(none it knows)"
