"""Compiling a regex (or a JSON schema, through its regex) to a character DFA in a process of its own, so that a
hostile pattern costs a bounded time and memory and never stalls the server: interegular builds the DFA (pure
Python; `((a{100}){100}){100}` would take minutes and gigabytes), outlines-core writes a schema's regex, and the
only way to bound either is to run it where it can be killed (docs/structured.md says why these two).

`compile_dfa(kind, text, alphabet)` sends the job to one long-lived worker (this file run as a script, in isolated
mode: it imports numpy, interegular and outlines-core, nothing of the package) and waits at most
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
            answer = _compile(json.loads(line))
        except Exception as e:  # anything else the compiler raised: the caller's error, the worker goes on
            answer = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
