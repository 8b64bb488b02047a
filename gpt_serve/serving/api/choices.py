"""A completions or chat request's choices: each a `TextStream` on its model's `Scheduler`, started together, held
open in the server's `Drain` until they end, cancelled when the client leaves; and the scoring of the prompts'
own tokens that `echo` with `logprobs` asks for."""

from __future__ import annotations

import time

from fastapi import Request

from ...generation.fields import RequestError
from ...generation.requests import SchedulerClosed, ServerBusy
from ...generation.text import TextStream
from ..launcher import Drain
from ..metrics import Metrics
from ..protocol import SHUTTING_DOWN, APIError, Job
from ..registry import ModelRegistry, ModelUnavailable
from .errors import unavailable
from .tokens import decode_ids


class Choice:
    """One choice: its text stream, and what the metrics and the answer need of it."""

    def __init__(self, index: int, text: TextStream, job: Job, metrics: Metrics):
        self.index, self.text, self.job, self.metrics, self.seen = index, text, job, metrics, 0

    async def take(self) -> str:
        """Waits for the next tokens (on the event loop, no thread); the new text (may be "")."""
        piece = await self.text.atake()
        stream = self.text.stream
        if stream.generated > self.seen:
            self.metrics.tokens_arrived(stream, self.job.model, self.job.backend, self.seen, time.perf_counter())
            self.seen = stream.generated
        if self.text.done:
            self.metrics.finish(
                self.job.model, self.job.backend, len(self.text.prompt_ids), self.text.tokens,
                self.text.finish_reason, stream.submitted_at,
            )  # fmt: skip
        return piece or ""

    @property
    def score(self) -> float:
        """The text's log-probability (best_of ranks choices by it)."""
        return sum(e[0] for e in self.text.logprobs)


def start_choices(registry: ModelRegistry, job: Job, metrics: Metrics, drain: Drain) -> list[Choice]:
    """Loads the model (first use: blocks) and submits every choice (prompt i's choice j is index i * best_of + j,
    with seed `seed + index`), each held open in `drain` until `end_choices`; APIError for what cannot be served."""
    try:
        loaded = registry.backend(job.model, job.backend)
        scheduler = registry.scheduler(job.model, job.backend)
    except ModelUnavailable as e:
        raise unavailable(e) from None
    ranked = job.best_of > job.n  # best_of ranks the choices by their logprobs
    choices: list[Choice] = []
    try:
        with scheduler.together():  # admitted together: the choices of a prompt share its prefill (forked)
            for i, prompt in enumerate(job.prompts):
                if not isinstance(prompt, str):
                    prompt = decode_ids(loaded.vocab, prompt, "prompt")
                for j in range(job.best_of):
                    index = i * job.best_of + j
                    try:
                        text = TextStream(
                            scheduler, loaded.vocab, job.request, index, prompt=prompt, end=job.end, ranked=ranked
                        )
                    except RequestError as e:
                        where = f"prompt {i}: " if len(job.prompts) > 1 else ""
                        raise APIError(400, f"{where}{e}", e.field) from None
                    drain.open.add(text)
                    choices.append(Choice(index, text, job, metrics))
    except BaseException as e:  # a refusal after some choices started: none of them is left behind
        end_choices(choices, drain)
        raise refusal(e) from None
    return choices


def refusal(e: BaseException) -> BaseException:
    """The APIError of the engine's refusal `e` (a full queue: 429; a scheduler closed by the shutdown: 503), or `e`
    itself."""
    if isinstance(e, ServerBusy):
        return APIError(429, str(e), None, "server_busy")
    if isinstance(e, SchedulerClosed):
        return APIError(503, "the server is shutting down", None, "server_error", SHUTTING_DOWN)
    return e


def end_choices(choices: list[Choice], drain: Drain) -> None:
    """The choices' rows freed (a no-op for those that ended) and forgotten by `drain`."""
    for choice in choices:
        choice.text.cancel()
        drain.open.discard(choice.text)


async def cancel_on_disconnect(raw_request: Request, work: list) -> None:
    """Waits for the client to leave (once the body is read, `receive` has nothing else to say), then cancels
    `work` (choices and scorings)."""
    while (await raw_request.receive())["type"] != "http.disconnect":
        pass
    for item in work:
        if item is not None:
            (item.text if isinstance(item, Choice) else item).cancel()


def score_prompts(registry: ModelRegistry, job: Job, choices: list[Choice], drain: Drain) -> list:
    """Per prompt, the scheduled scoring of its own tokens (OpenAI's echo with logprobs), None where there is
    nothing to score (no echo of logprobs, or a stream): chunks between decode steps, beside the generation. A
    refusal (429) releases all the request has started: its scorings, and its choices' rows and places in
    `drain`."""
    if not job.echo or job.stream:
        return []
    if job.logprobs is None:
        return [None] * (len(choices) // job.best_of)
    scheduler = registry.scheduler(job.model, job.backend)
    scorings = []
    try:
        for k in range(0, len(choices), job.best_of):
            scorings.append(scheduler.score(choices[k].text.prompt_ids, job.logprobs))
    except BaseException as e:
        for scoring in scorings:
            scoring.cancel()
        end_choices(choices, drain)
        raise refusal(e) from None
    return scorings
