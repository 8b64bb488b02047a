"""Where decode loops run: a `Runner` thread that runs one or more schedulers' loops in turn, the process's one
runner for PyTorch models (`torch_runner`), and `InlineRunner`, no thread at all: the loop steps on the thread that
reads its streams (scripts, tests, the library's `generate_text`)."""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Protocol

logger = logging.getLogger(__name__)


class Loop(Protocol):
    """What a runner runs: a scheduler's loop, one iteration at a time (`gpt_serve.generation.scheduler`)."""

    @property
    def closed(self) -> bool:
        """Closed: the runner ends it (`shutdown`) instead of iterating it."""

    def iterate(self) -> bool:
        """One iteration; whether there is more to do."""

    def shutdown(self, error: BaseException | None = None) -> None:
        """Ends what it runs or holds (with `error`, when the loop itself failed)."""


class Runner:
    """A thread that runs the decode loops of one or more schedulers, one iteration of each in turn, and other work
    on their models between iterations (`call`).

    Why PyTorch models share one (`torch_runner()`): PyTorch's CPU ops run on OpenMP (libgomp) thread teams, one
    team per thread that has run a parallel op, kept for the thread's life. Once the teams' threads outnumber the
    CPUs, libgomp stops letting them spin between ops and every op waits for its team to be woken: the idle team of
    the thread that loaded a model makes a decode step on another thread several times slower
    (`benchmarks/decode_threads.py`; docs/benchmarks.md, "One thread for every PyTorch model"). So every PyTorch
    model of a process is loaded and decoded on one thread.
    ONNX Runtime sessions have their own thread pools: each of their schedulers gets a runner of its own.

    `stop()` ends the loops it runs (their requests end with an error) after the current iteration. At interpreter
    exit every runner still running is stopped that way: a thread still inside a PyTorch op while the interpreter
    tears down aborts the process ("terminate called without an active exception").
    """

    inline = False

    def __init__(self, name: str = "gpt-serve-scheduler"):
        self._schedulers: list[Loop] = []
        self._calls: queue.SimpleQueue = queue.SimpleQueue()  # (function, args, future)
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        _runners.add(self)

    @property
    def thread(self) -> threading.Thread:
        return self._thread

    def wake(self) -> None:
        self._event.set()

    def call(self, function, *args):
        """Runs `function(*args)` on the runner's thread, between two iterations, and returns its result (or raises
        its error)."""
        if threading.current_thread() is self._thread:
            return function(*args)
        future: Future = Future()
        with self._lock:
            if self._stopping or not self._thread.is_alive():
                raise RuntimeError("the runner is stopped")
            self._calls.put((function, args, future))
        self.wake()
        return future.result()

    def stop(self, timeout: float = 10.0) -> None:
        """Ends the loops it runs after the current iteration, and waits up to `timeout` seconds for the thread."""
        self.request_stop()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=timeout)

    def request_stop(self) -> None:
        """`stop` without waiting."""
        with self._lock:
            self._stopping = True
        self.wake()

    def add(self, scheduler: Loop) -> None:
        """Runs `scheduler`'s loop from now on, in turn with the others."""
        with self._lock:
            if self._stopping:
                raise RuntimeError("the runner is stopped")
            self._schedulers.append(scheduler)
        self.wake()

    def _run_calls(self) -> None:
        while not self._calls.empty():
            function, args, future = self._calls.get()
            try:
                future.set_result(function(*args))
            except BaseException as e:  # the caller gets it
                future.set_exception(e)

    def _run(self) -> None:
        while True:
            self._run_calls()
            with self._lock:
                stopping, schedulers = self._stopping, list(self._schedulers)
            busy = False
            for scheduler in schedulers:
                try:
                    if not stopping and not scheduler.closed:
                        busy = scheduler.iterate() or busy
                        continue
                    scheduler.shutdown()
                except BaseException as e:  # the loop itself failed (no memory for a batch): only it ends
                    logger.exception("a decode loop failed; its requests end with the error")
                    try:
                        scheduler.shutdown(e)
                    except BaseException:
                        logger.exception("and could not end its requests")
                with self._lock:
                    self._schedulers.remove(scheduler)
            if stopping and not schedulers:
                break
            if not busy:
                with self._lock:
                    idle = self._calls.empty() and not self._stopping and not any(s.closed for s in schedulers)
                if idle:
                    self._event.wait()
                    self._event.clear()
        while not self._calls.empty():
            self._calls.get()[2].set_exception(RuntimeError("the runner is stopped"))


_runners: weakref.WeakSet[Runner] = weakref.WeakSet()


@atexit.register
def _stop_runners() -> None:
    """Runs before the interpreter stops its daemon threads (after the others have ended)."""
    runners = list(_runners)
    for runner in runners:  # all of them at once, then one deadline for all
        runner.request_stop()
    deadline = time.monotonic() + 10
    for runner in runners:
        runner.thread.join(timeout=max(0.0, deadline - time.monotonic()))


_torch_runner: Runner | None = None
_torch_runner_lock = threading.Lock()


def torch_runner() -> Runner:
    """The process's one runner for PyTorch models (see `Runner`), started on first use."""
    global _torch_runner
    with _torch_runner_lock:
        if _torch_runner is None or not _torch_runner.thread.is_alive():
            _torch_runner = Runner("gpt-serve-torch")
        return _torch_runner


class InlineRunner:
    """A runner without a thread: `Scheduler(backend, runner=InlineRunner())` steps its loop when a consumer reads a
    stream (`Stream.take` runs iterations until that stream has a token), on the consumer's thread. One thread then
    does everything, as a script that loaded a model expects; the loop and its forward passes are the same."""

    inline = True

    def __init__(self):
        self.thread = threading.current_thread()
        self._stopping = False

    def wake(self) -> None:
        pass

    def call(self, function, *args):
        if self._stopping:
            raise RuntimeError("the runner is stopped")
        return function(*args)

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True

    def add(self, scheduler: Loop) -> None:
        if self._stopping:
            raise RuntimeError("the runner is stopped")
