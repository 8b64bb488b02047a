"""The prefilled prompts a backend keeps across requests: a prompt's KV cache and last logits, by its token ids.

A decode batch prefills a new row's window in a forward pass (`DecodeBatch.add_rows`). The rows admitted together
whose windows are the same already share one prefill (`RunningBatch.join`); this cache spares the prefill of a
window that an earlier iteration prefilled (the demo's example prompts, a system prompt every request starts with):
the row's keys and values are copied in instead, the numbers of the earlier prefill, bit for bit. Whole windows
only, not partial prefixes: a row's cache holds the positions of its own window, and a window that slid (exact mode,
refill) starts at another token. A window is kept the second time it is prefilled, not the first: most windows are
seen once (a preempted row's, a slid one's, a unique prompt's) and would only push out the ones that come back; the
first sighting costs a key in a bounded set. Kept by the backend (its weights never change once loaded:
`load_backend` gives one to every backend it loads), bounded by bytes, least recently used first out; safe to share
across threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

__all__ = ["DEFAULT_PROMPT_CACHE_BYTES", "PromptCache", "cached_windows", "check_max_bytes"]

DEFAULT_PROMPT_CACHE_BYTES = 64 * 2**20  # 64 MiB: ~10,000 positions of the shipped model, ~3,600 of the lesson's size
SEEN_WINDOWS = 4096  # the windows remembered as prefilled once (a hash of their ids: 8 bytes each, not the ids)


def check_max_bytes(value: object) -> int:
    """`value` if it is a cache size (an int >= 0); a ValueError naming it otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"max_bytes must be an int >= 0, got {value!r}")
    return value


class PromptCache:
    """Prefilled windows by their ids (a tuple of ints): an entry is whatever the batch stores (its per-layer keys and
    values, and the logits), with its size in bytes. At most `max_bytes` in all; an entry larger than that is not
    kept. `hits` and `misses` count the lookups."""

    def __init__(self, max_bytes: int = DEFAULT_PROMPT_CACHE_BYTES):
        self.max_bytes = check_max_bytes(max_bytes)
        self.bytes = 0
        self.hits = self.misses = 0
        self._entries: OrderedDict[tuple[int, ...], tuple[Any, int]] = OrderedDict()
        self._seen: OrderedDict[int, None] = OrderedDict()  # hashes: a collision only keeps a window one prefill early
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return (
            f"PromptCache({len(self)} prompts, {self.bytes / 2**20:.1f} of {self.max_bytes / 2**20:.1f} MiB, "
            f"{self.hits} hits, {self.misses} misses)"
        )

    def get(self, ids: tuple[int, ...]) -> Any | None:
        """The entry stored for `ids` (now the most recently used), or None."""
        with self._lock:
            found = self._entries.get(ids)
            if found is None:
                self.misses += 1
                return None
            self._entries.move_to_end(ids)
            self.hits += 1
            return found[0]

    def admit(self, ids: tuple[int, ...]) -> bool:
        """Whether `ids`, just prefilled, is worth keeping: True where it was prefilled before (then `put` it); the
        first time, False, and the window is remembered."""
        key = hash(ids)
        with self._lock:
            if key in self._seen:
                del self._seen[key]
                return True
            self._seen[key] = None
            if len(self._seen) > SEEN_WINDOWS:
                self._seen.popitem(last=False)
            return False

    def offer(self, ids: tuple[int, ...], copy: Callable[[], tuple[list, Any]]) -> tuple[list, Any] | None:
        """A window just prefilled: where it is worth keeping (`admit`), `copy()` (its per-layer arrays or tensors and
        its logits, copies the batch will not change) is stored, sized by their bytes, and returned; else None."""
        if not self.admit(ids):
            return None
        entry = copy()
        self.put(ids, entry, sum(a.nbytes for a in entry[0]) + entry[1].nbytes)
        return entry

    def put(self, ids: tuple[int, ...], entry: Any, nbytes: int) -> None:
        """Stores `entry` for `ids`, dropping the least recently used entries to stay within `max_bytes`."""
        if nbytes > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(ids, None)
            if old is not None:
                self.bytes -= old[1]
            while self._entries and self.bytes + nbytes > self.max_bytes:
                self.bytes -= self._entries.popitem(last=False)[1][1]
            self._entries[ids] = (entry, nbytes)
            self.bytes += nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._seen.clear()
            self.bytes = 0


def cached_windows(cache: PromptCache | None, ids) -> tuple[list[tuple[int, ...]], list[Any | None]]:
    """Each window's key (its ids as a tuple) and its entry in `cache` (None: not cached, or no cache), for the rows
    of `ids` (k, L), a numpy array."""
    if cache is None:
        return [], [None] * len(ids)
    keys = [tuple(row) for row in ids.tolist()]
    return keys, [cache.get(key) for key in keys]
