"""What one request may ask of a server in all (`RequestCaps`): its rows times their max_tokens, and the logprob
entries it would accumulate. Standard library only, so the CLI shows the defaults in its parsers; the API checks
them (`protocol.check_caps`) before anything starts. docs/serving.md, "Fair sharing", gives the figures."""

from __future__ import annotations

from dataclasses import dataclass

# rows x max_tokens of one request: 16 rows of 16,384 tokens, or 2 of the specification's 100,000
MAX_REQUEST_TOKENS = 262_144
# logprob entries of one request's rows (each token's own and each of its top ones): ~12 bytes each as the engine
# holds them (`generation.token_logprobs`), so ~25 MB; echoed prompts' own are bounded by the prompt limit instead
MAX_REQUEST_LOGPROBS = 2_097_152


@dataclass(frozen=True)
class RequestCaps:
    """A server's caps on one request (`gpt-serve serve --max-request-tokens`, `--max-request-logprobs`)."""

    max_request_tokens: int = MAX_REQUEST_TOKENS
    max_request_logprobs: int = MAX_REQUEST_LOGPROBS
