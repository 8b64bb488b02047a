"""How many threads a forward pass may use: at most the CPUs this process may run on.

More intra-op threads than CPUs never helps and can cost dearly: the threads of one OpenMP or ONNX Runtime pool
wait for each other at every operator (docs/benchmarks.md, "Figures behind design choices"), so every entry point
checks the count here. Torch-free.
"""

from __future__ import annotations

import os


def available_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a container's share; else all of them)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def check_threads(threads: object, default: str = "the runtime's default") -> int | None:
    """`threads` if it is None (`default`) or an integer in [1, available_cpus()]; a ValueError otherwise."""
    if threads is None:
        return None
    cpus = available_cpus()
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= cpus:
        raise ValueError(
            f"threads must be None ({default}) or an integer in [1, {cpus}] (the CPUs this process may use), got "
            f"{threads!r}"
        )
    return threads
