"""The numbers that bound every HTTP server of gpt-serve (`ServerLimits`), apart from the code that enforces them
(`gpt_serve.serving.http_guards` and `launcher`, which need the `serve` extra): the CLI shows them in every command's
parser, so they import nothing but the standard library."""

from __future__ import annotations

from dataclasses import dataclass

# the most prompt text a request may carry (the specification's 100,000 characters) written as \\uXXXX escapes fits
MAX_BODY_BYTES = 1 << 20
MAX_BODIES = 256  # request bodies being received at once (a burst of small requests fits)
MAX_BODIES_BYTES = 64 << 20  # and their bytes in all: 64 bodies at the largest
HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 30.0
SHUTDOWN_TIMEOUT = 10.0


@dataclass(frozen=True)
class ServerLimits:
    """A server's bounds (see `gpt_serve.serving.http_guards` and `launcher`); the defaults are `gpt-serve serve`'s
    and the demo's."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_bodies: int = MAX_BODIES
    max_bodies_bytes: int = MAX_BODIES_BYTES
    body_timeout: float = BODY_TIMEOUT
    header_timeout: float = HEADER_TIMEOUT
    shutdown_timeout: float = SHUTDOWN_TIMEOUT
