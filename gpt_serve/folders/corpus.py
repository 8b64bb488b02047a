"""The corpus: Tiny Shakespeare found or downloaded (sha256-checked), any text file read, the lesson's split, and
sample prompts drawn from a text's training split. What a model folder records of its text (`corpus.json`) is
`gpt_serve.folders.corpus_record`.

Torch-free. The training pipeline and the export share it, so the export measures the validation loss on exactly
the characters training held out.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

from ..files import check_regular

logger = logging.getLogger(__name__)

TINY_SHAKESPEARE_URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
TINY_SHAKESPEARE_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
TRAIN_FRACTION = 0.9  # the lesson's split: first 90% train, last 10% validation
# Tiny Shakespeare's 65 characters in id order (the lesson's `sorted(set(text))`), for a vocabulary without the file
TINY_SHAKESPEARE_CHARS = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def cache_dir() -> Path:
    """Where the download goes: $GPT_SERVE_CACHE, else the user cache dir (e.g. ~/.cache/gpt-serve)."""
    if os.environ.get("GPT_SERVE_CACHE"):
        return Path(os.environ["GPT_SERVE_CACHE"])
    import platformdirs

    return Path(platformdirs.user_cache_dir("gpt-serve"))


def sha256_of(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The sha256 of the file's bytes, read in chunks of `chunk` bytes (a large file is never held whole)."""
    digest = hashlib.sha256()
    with open(check_regular(path), "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def download_tiny_shakespeare(dest: str | os.PathLike | None = None) -> Path:
    """Tiny Shakespeare in the user cache, downloaded on first use; its sha256 is checked before it is kept."""
    dest = Path(dest) if dest is not None else cache_dir() / "tinyshakespeare.txt"
    if dest.is_file():
        if sha256_of(dest) == TINY_SHAKESPEARE_SHA256:
            return dest
        logger.warning("%s does not have the expected sha256; downloading it again", dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    logger.info("downloading Tiny Shakespeare from %s to %s", TINY_SHAKESPEARE_URL, dest)
    try:
        with urllib.request.urlopen(TINY_SHAKESPEARE_URL, timeout=60) as response:
            payload = response.read()
    except OSError as e:  # URLError (no network, DNS, HTTP status), timeouts, resets
        reason = getattr(e, "reason", None) or e
        raise ConnectionError(
            f"could not download Tiny Shakespeare from {TINY_SHAKESPEARE_URL} ({reason}). Pass --data PATH to a "
            f"local copy, or put the file at {dest}."
        ) from None
    digest = hashlib.sha256(payload).hexdigest()
    if digest != TINY_SHAKESPEARE_SHA256:
        raise ValueError(
            f"the file downloaded from {TINY_SHAKESPEARE_URL} has sha256 {digest}, expected "
            f"{TINY_SHAKESPEARE_SHA256}; it was not saved. Pass --data PATH to a local copy instead."
        )
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".download-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return dest


def load_text(path: str | os.PathLike | None = None) -> str:
    """The corpus at `path`, or Tiny Shakespeare (downloaded once) when `path` is None."""
    path = check_regular(Path(path) if path is not None else download_tiny_shakespeare())
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path} (pass --data PATH to a UTF-8 text file)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"data file {path} is not UTF-8 text ({e})") from None
    if len(text) < 2:
        raise ValueError(f"data file {path} has {len(text)} characters; training needs a real corpus")
    return text


S = TypeVar("S", bound=Sequence)


def train_val_split(data: S, train_fraction: float = TRAIN_FRACTION) -> tuple[S, S]:
    """The lesson's split of a corpus (text, ids, a tensor): the first `train_fraction` trains, the rest validates."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must be in (0, 1), got {train_fraction}")
    n = int(train_fraction * len(data))
    return data[:n], data[n:]


# -- sample prompts ---------------------------------------------------------------------------------------------------

SAMPLE_PROMPTS = 5  # how many sample prompts a record draws from its text
PROMPT_CHARS = 48  # about the longest sample prompt, in characters (cut at a space or a line end)


def sample_prompts(text: str, n: int = SAMPLE_PROMPTS, max_chars: int = PROMPT_CHARS) -> tuple[str, ...]:
    """`n` prompts drawn evenly from `text`: the starts of its paragraphs (a line after a blank line, or the first
    line), else of its lines, each cut to about `max_chars` at a line end or a space; prompts of the training split
    only, so none is a line the validation measures. The text is walked line by line, never copied or split."""
    end = int(TRAIN_FRACTION * len(text)) if len(text) >= 10 else len(text)
    paragraphs = sum(1 for _ in _starts(text, end, paragraphs=True))
    by_paragraph = paragraphs >= n
    count = paragraphs if by_paragraph else sum(1 for _ in _starts(text, end, paragraphs=False))
    wanted = {k * count // n for k in range(n)} if count > n else set(range(count))
    prompts = [
        _prompt_at(text, start, end, max_chars)
        for k, start in enumerate(_starts(text, end, paragraphs=by_paragraph))
        if k in wanted
    ]
    return tuple(dict.fromkeys(p for p in prompts if p))


def _lines(text: str, end: int, start: int = 0):
    """(start, stop) of each line of `text[:end]` from `start` on (as `text[:end].split("\\n")` gives them)."""
    while True:
        stop = text.find("\n", start, end)
        if stop < 0:
            yield start, end
            return
        yield start, stop
        start = stop + 1


def _starts(text: str, end: int, paragraphs: bool):
    """Where each paragraph (a non-blank line first or after a blank one), or each non-blank line, starts."""
    previous_blank = True
    for start, stop in _lines(text, end):
        blank = not text[start:stop].strip()
        if not blank and (previous_blank or not paragraphs):
            yield start
        previous_blank = blank


def _prompt_at(text: str, start: int, end: int, max_chars: int) -> str:
    """The paragraph from offset `start` on (at most 4 lines, ending before `end`), cut to about `max_chars`: at a
    line end, else at a space, else at `max_chars`."""
    block = []
    for line_start, stop in _lines(text, end, start):
        line = text[line_start:stop]
        if (block and not line.strip()) or len(block) == 4:
            break
        block.append(line)
    paragraph = "\n".join(block).rstrip()
    if len(paragraph) <= max_chars:
        return paragraph
    head = paragraph[:max_chars]
    cut = head.rfind("\n")
    if cut < max_chars // 3:
        cut = head.rfind(" ")
    return (head[:cut] if cut >= max_chars // 3 else head).rstrip()
