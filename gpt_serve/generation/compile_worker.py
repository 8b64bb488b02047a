"""Compiling a regex (or a JSON schema, through its regex) to a character DFA in a process of its own, so that a
hostile pattern costs a bounded time and memory and never stalls the server: interegular builds the DFA (pure
Python; `((a{100}){100}){100}` would take minutes and gigabytes), outlines-core writes a schema's regex, and the
only way to bound either is to run it where it can be killed (docs/structured.md says why these two). A grammar
(and `json_object`) is checked here too, by llguidance (`compile_grammar`): parsed, its first mask computed, before
the engine builds its own matchers from it (`grammar`).

`compile_dfa(kind, text, alphabet)` sends the job to one long-lived worker (this file run as a script, in isolated
mode: it imports numpy, interegular, outlines-core and llguidance, nothing of the package) and waits at most
`COMPILE_SECONDS`; past that, or if the worker dies (its memory is capped at `WORKER_MEMORY`), the worker is killed,
the next job starts a new one, and the caller gets a `CompileError`. numpy only on this side.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)

COMPILE_SECONDS = 5.0  # the most one compilation may take (a busy 2-core machine compiles a small schema in ms)
WORKER_MEMORY = 2 << 30  # bytes of address space the worker may use
MAX_STATES = 20_000  # states of a compiled automaton (its tables are states x alphabet)
MAX_REGEX_CHARS = 100_000  # a schema's regex longer than this is refused before the DFA is built
# llguidance's JSON for `json_object`: whitespace between tokens at most one space (as outlines-core's schemas:
# `[ ]?`), so that a sampled object does not wander off into whitespace
JSON_OPTIONS = {"whitespace_pattern": "[ ]?"}


class CompileError(ValueError):
    """The pattern could not be compiled: malformed, too large, or too slow (the message says which)."""


@dataclass(frozen=True)
class DFA:
    """A deterministic automaton over `alphabet` (characters): `table[s, a]` is the state after character a from
    state s (-1: none), `initial` the start state, `accepting[s]` whether s ends a text of the language."""

    alphabet: tuple[str, ...]
    table: np.ndarray  # (S, A) int32
    initial: int
    accepting: np.ndarray  # (S,) bool
    regex: str  # the regex compiled (a schema's own, as outlines-core wrote it)


class _Worker:
    def __init__(self):
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None

    def run(self, job: dict, timeout: float) -> dict:
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._process = subprocess.Popen(
                    [sys.executable, "-I", os.path.abspath(__file__)],  # this file alone: no package to import
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, "OMP_NUM_THREADS": "1"},
                )
            process = self._process
            answer: list = []
            reader = threading.Thread(target=lambda: answer.append(process.stdout.readline()), daemon=True)
            try:
                process.stdin.write(json.dumps(job).encode() + b"\n")
                process.stdin.flush()
            except OSError:
                pass  # the worker died: its missing answer says so below
            reader.start()
            reader.join(timeout)
            if not answer or not answer[0]:
                timed_out = reader.is_alive()
                self._kill()
                if timed_out:
                    raise CompileError(f"compiling it took longer than {timeout:g} s: give a smaller pattern")
                raise CompileError("compiling it ran out of memory: give a smaller pattern")
            return json.loads(answer[0])

    def _kill(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None


_WORKER = _Worker()


def compile_dfa(
    kind: str, text: str, alphabet: tuple[str, ...], end: str = "", timeout: float = COMPILE_SECONDS
) -> DFA:
    """The DFA of `text`, a regex (`kind` "regex") or a JSON schema's JSON text (`kind` "schema"), followed by the
    regex `end`, over `alphabet`. CompileError naming what is wrong (a malformed pattern, an unsupported schema, a
    pattern too large or too slow to compile)."""
    answer = _WORKER.run({"kind": kind, "text": text, "end": end, "alphabet": list(alphabet)}, timeout)
    if "error" in answer:
        raise CompileError(answer["error"])
    shape = tuple(answer["shape"])
    table = np.frombuffer(base64.b64decode(answer["table"]), dtype=np.int32).reshape(shape).copy()
    accepting = np.zeros(shape[0], dtype=bool)
    accepting[answer["accepting"]] = True
    return DFA(tuple(alphabet), table, int(answer["initial"]), accepting, answer["regex"])


def compile_grammar(
    kind: str,
    text: str,
    chars: tuple[str, ...],
    allowed: tuple[bool, ...],
    others: tuple[str, ...],
    end: str = "",
    timeout: float = COMPILE_SECONDS,
) -> str:
    """llguidance's grammar (its JSON) for `text`, a Lark or EBNF grammar (`kind` "grammar") or a JSON schema's JSON
    text (`kind` "json_object"), followed by the literal `end` (optional), checked over the vocabulary `chars` (the ids
    `allowed` only). CompileError naming what is wrong (llguidance's account of a malformed grammar, a grammar too
    large or too slow), `Unwritable` where the vocabulary cannot write its first character (naming, among `others`
    and `chars`, the characters it could start with)."""
    job = {"kind": kind, "text": text, "end": end, "chars": list(chars), "allowed": list(allowed),
           "others": list(others)}  # fmt: skip
    answer = _WORKER.run(job, timeout)
    if "error" in answer:
        raise CompileError(answer["error"])
    if "missing" in answer:
        raise Unwritable(answer["missing"])
    return answer["grammar"]


class Unwritable(CompileError):
    """The vocabulary cannot write a first character of the grammar; `missing`: those it could start with."""

    def __init__(self, missing: list[str]):
        super().__init__(f"it lacks the characters {missing}")
        self.missing = missing


def grammar_tokenizer(chars: tuple[str, ...] | list[str]):
    """llguidance's tokenizer for a character vocabulary: token i is `chars[i]`'s UTF-8 bytes, id `len(chars)` a
    virtual EOS (llguidance wants one; our vocabularies have none), and after it a token for each byte no character
    of the vocabulary is alone, so that llguidance can tokenize any text it would force (its own check that a text
    can be written). Only the first `len(chars)` ids are ever sampled: masks are cut there (`grammar_mask`)."""
    import llguidance

    ids = {c: i for i, c in enumerate(chars)}
    own = {c.encode() for c in chars}
    extra = [bytes([b]) for b in range(256) if bytes([b]) not in own]
    byte_ids = {b[0]: len(chars) + 1 + i for i, b in enumerate(extra)}

    class CharTokens:
        eos_token_id = len(chars)
        bos_token_id = None
        tokens = [c.encode() for c in chars] + [b"<|end|>"] + extra
        special_token_ids = [len(chars)]

        def __call__(self, text):
            text = text.decode("utf-8", "surrogateescape") if isinstance(text, bytes) else text
            out = []
            for c in text:
                if c in ids:
                    out.append(ids[c])
                else:  # a character the vocabulary lacks: its bytes (a surrogate escape: the byte it stands for)
                    raw = bytes([ord(c) - 0xDC00]) if "\udc80" <= c <= "\udcff" else c.encode()
                    out.extend(byte_ids.get(b, ids.get(chr(b), 0)) for b in raw)
            return out

    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(CharTokens()), slices=[])


def grammar_mask(matcher, tokenizer, vocab_size: int) -> np.ndarray:
    """The ids `matcher` (over `tokenizer`) allows next, of the vocabulary's `vocab_size` (the virtual EOS and the
    byte tokens left out): (V,) bool."""
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    bits = allocate_token_bitmask(1, tokenizer.vocab_size)
    fill_next_token_bitmask(matcher, bits)
    return np.unpackbits(bits.view(np.uint8), bitorder="little")[:vocab_size].astype(bool)


def dead_end(matcher) -> bool:
    """Whether `matcher` stopped because the grammar goes on only with text the vocabulary cannot write (llguidance
    stops, or enters an error state naming it, when no token can extend the text)."""
    reason = matcher.stop_reason() if not matcher.is_error() else matcher.get_error().split("\n", 1)[0]
    return reason in ("NoExtension", "NoExtensionBias") and not matcher.is_accepting()


def _grammar(job: dict) -> str:
    """The job's grammar as llguidance's JSON: Lark or EBNF (GBNF, as vLLM takes it) converted, a JSON schema
    compiled, and an `end` made an optional literal after it (a rule around the grammar, which is kept by name)."""
    import llguidance

    if job["kind"] == "json_object":
        parsed = json.loads(llguidance.LLMatcher.grammar_from_json_schema(job["text"], overrides=JSON_OPTIONS))
    else:  # Lark as it is, EBNF (GBNF) converted to Lark: llguidance's `grammar_from("grammar", ...)`
        lark = llguidance.grammar_from("grammar", job["text"])  # ValueError naming a malformed EBNF grammar
        parsed = {"grammars": [{"lark_grammar": lark}]}
    if not job["end"]:
        return json.dumps(parsed)
    inner = parsed["grammars"][0]
    inner.setdefault("name", "constrained")
    outer = f"start: @{inner['name']} END?\nEND: {json.dumps(job['end'])}\n"
    parsed["grammars"].insert(0, {"lark_grammar": outer})
    return json.dumps(parsed)


def _compile_grammar(job: dict) -> dict:
    """The worker's side of `compile_grammar`: the grammar, and its first mask over the vocabulary."""
    import llguidance

    try:
        grammar = _grammar(job)
    except ValueError as e:
        return {"error": f"the grammar is malformed: {str(e).rstrip()}"}
    chars = job["chars"]
    tokenizer = grammar_tokenizer(chars)
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=0)
    if matcher.is_error():
        return {"error": f"the grammar is malformed or unsupported: {matcher.get_error().rstrip()}"}
    first = grammar_mask(matcher, tokenizer, len(chars)) & np.array(job["allowed"], dtype=bool)
    if matcher.is_error() and not dead_end(matcher):
        return {"error": f"the grammar could not be compiled: {matcher.get_error().splitlines()[0]}"}
    if not first.any() and not matcher.is_accepting():
        every = chars + [c for c in job["others"] if c not in set(chars)]
        wide_tokenizer = grammar_tokenizer(every)
        wide = llguidance.LLMatcher(wide_tokenizer, grammar, log_level=0)
        wanted = np.flatnonzero(grammar_mask(wide, wide_tokenizer, len(every))).tolist()
        have = {c for c, ok in zip(chars, job["allowed"], strict=True) if ok}
        return {"missing": [every[i] for i in wanted if every[i] not in have]}
    return {"grammar": grammar}


def _compile(job: dict) -> dict:
    """The worker's side: a schema to its regex (outlines-core), the regex to a character DFA (interegular), as a
    dense table over the alphabet, states renumbered 0..S-1."""
    import interegular

    text, alphabet = job["text"], job["alphabet"]
    if job["kind"] == "schema":
        from outlines_core.json_schema import build_regex_from_schema

        try:
            text = build_regex_from_schema(text)
        except (ValueError, TypeError) as e:
            return {"error": f"the JSON schema is not supported: {e}"}
        if len(text) > MAX_REGEX_CHARS:
            return {"error": f"the schema's regex is {len(text):,} characters long; the limit is {MAX_REGEX_CHARS:,}"}
    if job["end"]:
        text = f"(?:{text}){job['end']}"
    try:
        fsm = interegular.parse_pattern(text).to_fsm()
    except Exception as e:  # interegular's parse errors are of several types
        return {"error": f"the regex is malformed or unsupported ({_syntax_error(text) or f'{type(e).__name__}: {e}'})"}
    states = sorted(fsm.states)
    if len(states) > MAX_STATES:
        return {"error": f"its automaton has {len(states):,} states; the limit is {MAX_STATES:,}"}
    number = {s: i for i, s in enumerate(states)}
    symbols = [fsm.alphabet[c] for c in alphabet]  # interegular's symbol of each character (or "anything else")
    table = np.full((len(states), len(alphabet)), -1, dtype=np.int32)
    for s, moves in fsm.map.items():
        row = table[number[s]]
        for a, symbol in enumerate(symbols):
            if symbol in moves:
                row[a] = number[moves[symbol]]
    return {
        "regex": text,
        "shape": list(table.shape),
        "table": base64.b64encode(table.tobytes()).decode(),
        "initial": number[fsm.initial],
        "accepting": [number[s] for s in fsm.finals],
    }


def _syntax_error(regex: str) -> str | None:
    """Python's account of a syntax error in `regex` (outlines-core's says only "error building NFA"), or None."""
    import re

    try:
        re.compile(regex)
    except re.error as e:
        return str(e)
    return None


def _serve() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY, WORKER_MEMORY))
    for line in sys.stdin.buffer:
        try:
            job = json.loads(line)
            answer = _compile_grammar(job) if job["kind"] in ("grammar", "json_object") else _compile(job)
        except Exception as e:  # anything else the compiler raised: the caller's error, the worker goes on
            answer = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
