"""A running request's state (`Row`) and the output side of a step: from a batch's logits to each row's next token
and logprobs (`next_tokens`), as array operations over the batch, each row inside its own error boundary.

What can go wrong for one row never reaches another: logits that are NaN or infinite (a broken model), logits that
its penalties made non-finite, a filter or a draw that raised, logprobs that could not be computed. Such a row gets
an error instead of a token (the scheduler ends its request with it); every other row gets exactly the token and
logprobs it would have had alone. numpy only.
"""

from __future__ import annotations

import numpy as np

from ..chargpt.window import window_keep, window_start
from .requests import EngineError, Stream
from .sampling import (
    SamplingParams,
    draw_uniforms,
    finite_rows,
    log_softmax,
    sample_groups,
    shared,
)

__all__ = ["Outcome", "Row", "next_tokens"]


class Row:
    """A running request: its tokens, RNG, window and penalty state.

    A row the scheduler preempts (`Scheduler`'s `preempt_after`) drops only its KV cache: this object, with its RNG
    and every other per-row state, waits in the queue and rejoins by prefilling its window (`window()`), so it goes
    on with exactly the tokens it would have made. State kept beside a row must be such state of this object (or be
    rebuilt from `ids`), never state of the batch."""

    def __init__(self, stream: Stream, block_size: int, vocab_size: int):
        r = stream.request
        self.stream, self.request = stream, r
        self.sampling: SamplingParams = shared(r.sampling)  # equal settings, one object: rows group by identity
        self.ids = [int(t) for t in r.prompt_ids]  # the prompt and every generated token
        self.prompt_len = len(self.ids)
        self.rng = np.random.default_rng(r.seed)
        self.keep = window_keep(block_size, r.window_mode, r.refill_tokens)
        self.exact = r.window_mode == "exact"
        self.stops = frozenset(int(t) for t in r.stop_token_ids)
        self.top_logprobs = r.logprobs
        self.left = r.max_new_tokens  # tokens still to make
        self.turn = 0  # tokens made since it last joined the batch (what preemption reads)
        s = r.sampling
        # OpenAI's penalties count the generated tokens only
        self.counts = np.zeros(vocab_size, dtype=np.int64) if s.presence_penalty or s.frequency_penalty else None
        # transformers' repetition penalty applies to every token seen so far: kept as a mask over the vocabulary
        self.seen = None
        if s.repetition_penalty != 1.0:
            self.seen = np.zeros(vocab_size, dtype=bool)
            self.seen[self.ids] = True
        # the window is ids[start:] (`gpt_serve.chargpt.window`): a prompt past it starts from its last `keep`
        self.start = window_start(len(self.ids), 0, block_size, self.keep)
        # structured outputs (`constraints`): OpenAI's logit_bias as a row over the vocabulary, and the automaton's
        # state, a function of the generated tokens (a row made again from its tokens finds it again)
        self.bias = None
        if r.logit_bias:
            self.bias = np.zeros(vocab_size)
            self.bias[[t for t, _ in r.logit_bias]] = [b for _, b in r.logit_bias]
        self.automaton = r.constraint
        self.state = self.automaton.walk(self.ids[self.prompt_len :]) if self.automaton is not None else 0

    def accept(self, token: int) -> bool:
        """Adds `token`; returns whether the request is complete (its length reached, or a stop token)."""
        self.ids.append(token)
        if self.seen is not None:
            self.seen[token] = True
        if self.counts is not None:
            self.counts[token] += 1
        self.left -= 1
        self.turn += 1
        if self.automaton is not None:
            self.state = self.automaton.advance(self.state, token)
            if self.automaton.is_final(self.state):  # accepted, and nothing may follow: "stop"
                return True
        return self.left <= 0 or token in self.stops

    def window(self) -> list[int]:
        return self.ids[self.start :]


class Outcome:
    """What a step gives the rows: `tokens[i]` and `logprobs[i]` for row i, or `errors[i]` (then tokens[i] is -1).
    A row's logprobs are `(logprob, top ids, their logprobs)`, as `TokenLogprobs.append` takes them."""

    __slots__ = ("tokens", "logprobs", "errors")

    def __init__(self, n: int):
        self.tokens = np.full(n, -1, dtype=np.int64)
        self.logprobs: list = [None] * n
        self.errors: dict[int, BaseException] = {}


def next_tokens(rows: list[Row], logits: np.ndarray, backend_name: str) -> Outcome:
    """One token per row from `logits` (rows, V), each with its own settings and RNG, and for the
    rows that ask for them (`Request.logprobs`) the token's log-probability and the top ones, of the model's own
    distribution (the logits before penalties): `(logprob, top ids, their logprobs)`. See the module docstring for the
    errors; `backend_name` names what computed the logits in them."""
    out = Outcome(len(rows))
    work = _penalized(rows, logits, out)
    _refuse_non_finite(rows, logits, work, out, backend_name)
    live = [i for i in range(len(rows)) if i not in out.errors]
    work, live = _constrained(rows, logits, work, live, out)
    _sample(rows, work, live, out)
    wanted = [i for i in live if rows[i].top_logprobs is not None and i not in out.errors]
    if wanted:
        _logprobs(rows, logits, wanted, out)
    return out


def _isolated(indices: list[int], out: Outcome, stage: str, batch, alone) -> None:
    """Runs `batch(indices)`; if it raises, `alone(i)` for each row, and a row whose own run raises ends with its
    error (an `EngineError` naming `stage`)."""
    try:
        batch(indices)
        return
    except Exception:  # one of the rows: find which, each alone
        pass
    for i in indices:
        try:
            alone(i)
        except Exception as e:
            out.errors[i] = EngineError(f"{stage} failed for this request: {type(e).__name__}: {e}")


def _penalized(rows: list[Row], logits: np.ndarray, out: Outcome) -> np.ndarray:
    """The logits after each row's penalties (a copy where any row has them), for all such rows at once (or, if
    that raises, each alone); a row whose penalties fail ends with an error."""
    penalized = [i for i, r in enumerate(rows) if r.seen is not None or r.counts is not None or r.bias is not None]
    if not penalized:
        return logits
    work = logits.copy()

    def penalize(indices: list[int]) -> None:
        with np.errstate(over="ignore", invalid="ignore"):  # non-finite logits are refused after (`next_tokens`)
            apply_penalties(work, [rows[i] for i in indices], indices)

    _isolated(penalized, out, "the penalties", penalize, lambda i: penalize([i]))
    return work


def _refuse_non_finite(rows: list[Row], logits: np.ndarray, work: np.ndarray, out: Outcome, backend_name: str) -> None:
    """The step's one finiteness check, over what is sampled from (`work`: the logits after penalties, `logits`
    itself where no row has any). A row that fails it ends with an error naming the cause: NaN or infinite logits
    from the backend (a penalty keeps a logit non-finite), else the penalties that overflowed them."""
    for i in np.flatnonzero(~finite_rows(work)).tolist():
        token = len(rows[i].ids) - rows[i].prompt_len + 1
        if work is logits or not np.isfinite(logits[i]).all():
            out.errors[i] = EngineError(
                f"{backend_name} computed NaN or infinite logits for token {token} of this request: nothing to "
                f"sample from, so it ends here (a broken model: check its weights and config)"
            )
        elif i not in out.errors:  # (a row whose penalties failed has that error already)
            out.errors[i] = EngineError(
                f"the penalties ({_penalty_settings(rows[i].sampling)}) made this request's logits infinite for "
                f"token {token}: nothing to sample from, so it ends here"
            )


def apply_penalties(work: np.ndarray, rows: list[Row], at: list[int]) -> None:
    """`rows`' logits, rows `at` of `work` (N, V), after their penalties, in place, as array operations over those
    rows: transformers' repetition penalty over each row's tokens so far (`Row.seen`), then OpenAI's presence and
    frequency penalties over its generated tokens (`Row.counts`), then its logit_bias. Each row's numbers are exactly
    those it would get alone (a test holds them so)."""
    repeat = [(i, row) for i, row in zip(at, rows, strict=True) if row.seen is not None]
    if repeat:
        where = [i for i, _ in repeat]
        seen = np.stack([row.seen for _, row in repeat])  # (k, V)
        # in the logits' own dtype, as dividing a float32 row by a Python float does
        penalty = np.array([row.sampling.repetition_penalty for _, row in repeat], dtype=work.dtype)[:, None]
        z = work[where]
        work[where] = np.where(seen, np.where(z > 0, z / penalty, z * penalty), z)
    counted = [(i, row) for i, row in zip(at, rows, strict=True) if row.counts is not None]
    if counted:
        where = [i for i, _ in counted]
        counts = np.stack([row.counts for _, row in counted])  # (k, V)
        frequency = np.array([row.sampling.frequency_penalty for _, row in counted])[:, None]
        presence = np.array([row.sampling.presence_penalty for _, row in counted])[:, None]
        work[where] -= frequency * counts + presence * (counts > 0)
    biased = [(i, row) for i, row in zip(at, rows, strict=True) if row.bias is not None]
    if biased:  # OpenAI's logit_bias, after the penalties
        work[[i for i, _ in biased]] += np.stack([row.bias for _, row in biased])


def _constrained(
    rows: list[Row], logits: np.ndarray, work: np.ndarray, live: list[int], out: Outcome
) -> tuple[np.ndarray, list[int]]:
    """`work` with the tokens each constrained live row's automaton does not allow there at -inf (a copy where any
    row has one), and the rows still live: for a regex, choices or a schema one lookup of its state's row in the
    automaton's table; for a grammar its parser's mask. The draw then renormalises over the allowed tokens; the
    logprobs stay the model's own (`logits`). A grammar row with nothing to write (its parser failed, or it goes on
    only with characters the vocabulary lacks) ends with an error naming why."""
    constrained = [i for i in live if rows[i].automaton is not None]
    if not constrained:
        return work, live
    if work is logits:
        work = logits.copy()
    by_automaton: dict[int, list[int]] = {}
    for i in constrained:
        by_automaton.setdefault(id(rows[i].automaton), []).append(i)
    for indices in by_automaton.values():
        automaton = rows[indices[0]].automaton
        try:
            allowed = automaton.masks([rows[i].state for i in indices])  # (k, V)
        except ValueError:  # a grammar row's: find which, each alone
            indices = [i for i in indices if not _failed_mask(rows, i, out)]
            if not indices:
                continue
            allowed = automaton.masks([rows[i].state for i in indices])
        work[indices] = np.where(allowed, work[indices], -np.inf)
    return work, [i for i in live if i not in out.errors]


def _failed_mask(rows: list[Row], i: int, out: Outcome) -> bool:
    """Whether row i has no mask (then it ends with the error naming why)."""
    try:
        rows[i].automaton.masks([rows[i].state])
    except ValueError as e:
        out.errors[i] = EngineError(str(e))
        return True
    return False


def _penalty_settings(s: SamplingParams) -> str:
    return (
        f"repetition_penalty {s.repetition_penalty:g}, presence_penalty {s.presence_penalty:g}, "
        f"frequency_penalty {s.frequency_penalty:g}"
    )


def _sample(rows: list[Row], work: np.ndarray, live: list[int], out: Outcome) -> None:
    """Each live row's token: all rows at once (rows that share settings as one group), or, if that raises, each row
    alone, so that a failure is the failing row's. Every sampling row draws its one uniform number first, so a retry
    draws nothing again."""
    if not live:
        return
    u = np.zeros(len(rows))
    u[live] = draw_uniforms([rows[i].sampling for i in live], [rows[i].rng for i in live])

    def batch(indices):
        chosen = [rows[i].sampling for i in indices]
        out.tokens[indices] = sample_groups(work[indices], chosen, u[indices])

    def alone(i):
        out.tokens[i] = sample_groups(work[i : i + 1], [rows[i].sampling], u[i : i + 1])[0]

    _isolated(live, out, "sampling", batch, alone)


def _logprobs(rows: list[Row], logits: np.ndarray, wanted: list[int], out: Outcome) -> None:
    def batch(indices):
        lp = log_softmax(logits[indices])  # (k, V), float64
        most = max(rows[i].top_logprobs for i in indices)
        top = np.argsort(-lp, axis=-1, kind="stable")[:, :most]  # (k, most)
        for k, i in enumerate(indices):
            ids = top[k, : rows[i].top_logprobs]
            out.logprobs[i] = (float(lp[k, out.tokens[i]]), ids, lp[k, ids])

    _isolated(wanted, out, "the logprobs", batch, lambda i: batch([i]))
