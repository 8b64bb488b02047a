"""Running a gpt-serve HTTP server with uvicorn (`run_server`; needs the `serve` extra), beyond what each request's
guards bound (`gpt_serve.serving.http_guards`):

- the request's headers: whole within `header_timeout` seconds of connecting, or of the previous answer on a kept-alive
  connection, or the connection is closed (`close_slow_headers`; uvicorn's own keep-alive timeout stops at a
  request's first byte);
- shutdown: open requests get `shutdown_timeout` seconds to end, then each is cut (its stream ends with
  `finish_reason: "abort"` and `data: [DONE]`), and a client that reads nothing more is dropped `SHUTDOWN_GRACE`
  seconds later (`Drain`, `run_server`); a second SIGINT or SIGTERM cuts them at once, the same way, and never
  skips the drain.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from .server_limits import ServerLimits

logger = logging.getLogger(__name__)

SHUTDOWN_GRACE = 2.0  # after the cut, for the streams' last chunks to leave


class Drain:
    """The API's open requests (their `TextStream`s), for a shutdown: `begin()` refuses new ones (503), `cut()` ends
    the open ones now (`finish_reason` "abort"; a stream then sends its last chunk and `data: [DONE]`)."""

    def __init__(self):
        self.open: set = set()
        self.closing = False

    def cut(self) -> None:
        self.closing = True
        for text in list(self.open):
            text.cancel(reason="abort")

    def close(self, timeout: float, grace: float = SHUTDOWN_GRACE) -> None:
        """Blocks (outside the server's event loop) until the open requests have ended, at most `timeout` seconds,
        then cuts the rest and gives their last chunks `grace` seconds to leave."""
        self.closing = True
        for wait, then in ((timeout, self.cut), (grace, None)):
            deadline = time.monotonic() + wait
            while self.open and time.monotonic() < deadline:
                time.sleep(0.02)
            if then is not None:
                then()


def close_slow_headers(server, seconds: float) -> threading.Thread:
    """Closes every connection of the uvicorn `server` whose next request's headers have not all come `seconds`
    after it connected (or after its previous answer): a thread that looks four times per `seconds`. A request being
    answered (a stream too) is never touched."""

    def watch():
        waiting_since: dict[tuple, float] = {}
        while not server.should_exit:
            now, seen = time.monotonic(), {}
            for conn in list(server.server_state.connections):
                cycle = getattr(conn, "cycle", False)  # False: not an HTTP connection (a websocket)
                if cycle is False or (cycle is not None and not cycle.response_complete):
                    continue
                since = seen[conn, cycle] = waiting_since.get((conn, cycle), now)
                if now - since >= seconds and not conn.transport.is_closing():
                    conn.loop.call_soon_threadsafe(conn.transport.close)
            waiting_since = seen
            time.sleep(seconds / 4)

    thread = threading.Thread(target=watch, name="close-slow-headers", daemon=True)
    thread.start()
    return thread


def run_server(
    app, host: str, port: int, log_level: str, limits: ServerLimits, drain: Drain, access_log: bool = False
) -> None:
    """Serves `app` (`gpt_serve.serving.api.create_app`) with uvicorn until SIGINT or SIGTERM, with the header timeout
    and the shutdown deadline of `limits`; a line per request in the log only with `access_log` (uvicorn's access
    log). A second signal (uvicorn's "force exit", which would skip the drain and drop the open streams without their
    last chunk) cuts the open requests at once instead: each still ends with `finish_reason: "abort"` and
    `data: [DONE]`, and the server exits when they have."""
    import uvicorn

    class Server(uvicorn.Server):
        loop: asyncio.AbstractEventLoop | None = None

        async def serve(self, sockets=None):
            self.loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig, frame):
            if not self.should_exit or self.loop is None:
                return super().handle_exit(sig, frame)
            logger.warning("signal %s during the shutdown: the open requests are cut now", sig)
            self.loop.call_soon_threadsafe(drain.cut)  # (not force_exit: the drain goes on)

        async def shutdown(self, sockets=None):
            drain.closing = True
            asyncio.get_running_loop().call_later(limits.shutdown_timeout, drain.cut)
            await super().shutdown(sockets)

    config = uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=access_log,
        timeout_graceful_shutdown=limits.shutdown_timeout + SHUTDOWN_GRACE,  # type: ignore[arg-type]
    )  # fmt: skip
    server = Server(config)
    close_slow_headers(server, limits.header_timeout)
    server.run()
