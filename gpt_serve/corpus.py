"""The corpus: Tiny Shakespeare found or downloaded (sha256-checked), any text file read, the lesson's split, and
what a model folder records of its text (`corpus.json`: `CorpusRecord`).

Torch-free. The training pipeline and the export share it, so the export measures the validation loss on exactly
the characters training held out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .files import check_regular

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


def sha256_of(path: str | os.PathLike) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


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


# -- what a model folder records of its text ----------------------------------------------------------------------

CORPUS_FILE_NAME = "corpus.json"  # in a model folder, beside config.json
SAMPLE_PROMPTS = 5  # how many sample prompts a record keeps
PROMPT_CHARS = 48  # about the longest sample prompt, in characters (cut at a space or a line end)
MAX_RECORD_TEXT = 500  # the longest name or description a record takes, in characters
TINY_SHAKESPEARE_NAME = "Tiny Shakespeare"
TINY_SHAKESPEARE_CHARACTERS = 1_115_394
TINY_SHAKESPEARE_DESCRIPTION = "about 40,000 lines from Shakespeare's plays (Karpathy's char-rnn corpus)"
# The shipped models' prompts: starts of real lines of Tiny Shakespeare, the speaker's name first.
TINY_SHAKESPEARE_PROMPTS = (
    "ROMEO:",
    "JULIET:\nO Romeo, Romeo! wherefore art thou",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "GLOUCESTER:\nNow is the winter of our discontent",
    "KING HENRY VI:\nMy lords, look where the sturdy rebel sits,",
)


@dataclass(frozen=True)
class CorpusRecord:
    """What a model folder records of the text it was trained on (`corpus.json`), so that every surface can present
    the model it serves (the demo's title, intro and examples, the card's snippets, the CLI's default prompt) and the
    export can validate on that text again without being told where it is.

    Args:
        name: what the text is called ("Tiny Shakespeare", "my_code.txt").
        description: one short sentence about it.
        prompts: a few sample prompts, starts of real lines of the text (the first is a surface's default prompt).
        sha256: the sha256 of the text's UTF-8 bytes (None when not known, e.g. an import given no text).
        source: the absolute path the text was read from (None when not known).
        characters: its length in characters.
    """

    name: str
    description: str
    prompts: tuple[str, ...] = ()
    sha256: str | None = None
    source: str | None = None
    characters: int | None = None

    @classmethod
    def of(
        cls,
        text: str,
        path: str | os.PathLike | None = None,
        name: str | None = None,
        description: str | None = None,
    ) -> CorpusRecord:
        """The record of `text`, read from `path`: Tiny Shakespeare is recognized by its sha256; another text is
        named after its file unless `name` is given."""
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        shakespeare = digest == TINY_SHAKESPEARE_SHA256
        if shakespeare and name is None and description is None:
            return cls.tiny_shakespeare(path)
        if name is None:
            name = TINY_SHAKESPEARE_NAME if shakespeare else (Path(path).name if path else "the training text")
        if description is None:
            description = TINY_SHAKESPEARE_DESCRIPTION if shakespeare else f"{len(text):,} characters of text"
        prompts = TINY_SHAKESPEARE_PROMPTS if shakespeare else sample_prompts(text)
        source = str(Path(path).resolve()) if path else None
        return cls(_checked_text("name", name), _checked_text("description", description), prompts, digest, source,
                   len(text))  # fmt: skip

    @classmethod
    def tiny_shakespeare(cls, path: str | os.PathLike | None = None) -> CorpusRecord:
        """Tiny Shakespeare's record (the shipped models'), read from `path` if given (its text is not read)."""
        source = str(Path(path).resolve()) if path else None
        return cls(TINY_SHAKESPEARE_NAME, TINY_SHAKESPEARE_DESCRIPTION, TINY_SHAKESPEARE_PROMPTS,
                   TINY_SHAKESPEARE_SHA256, source, TINY_SHAKESPEARE_CHARACTERS)  # fmt: skip

    @property
    def is_tiny_shakespeare(self) -> bool:
        return self.sha256 == TINY_SHAKESPEARE_SHA256

    @property
    def default_prompt(self) -> str:
        """What a surface offers first: the first sample prompt, or "" (the text after a newline)."""
        return self.prompts[0] if self.prompts else ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any, where: str = CORPUS_FILE_NAME) -> CorpusRecord:
        """A record from its JSON object; a ValueError naming the field that is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} must hold a JSON object, got a {type(data).__name__}")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f"{where} has unknown fields {unknown}")
        for key in ("name", "description"):
            if not isinstance(data.get(key), str) or not data[key].strip():
                raise ValueError(f"{where}: {key!r} must be a non-empty string, got {data.get(key)!r}")
        prompts = data.get("prompts", [])
        if not isinstance(prompts, list) or not all(isinstance(p, str) and p for p in prompts):
            raise ValueError(f"{where}: 'prompts' must be a list of non-empty strings")
        for key in ("sha256", "source"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise ValueError(f"{where}: {key!r} must be a string or null, got {data[key]!r}")
        if data.get("characters") is not None and not isinstance(data["characters"], int):
            raise ValueError(f"{where}: 'characters' must be an integer or null, got {data['characters']!r}")
        return cls(**{**data, "prompts": tuple(prompts)})

    def find_text(self) -> Path | None:
        """The recorded text if it is still where it was read from with the same sha256; Tiny Shakespeare in the
        user cache otherwise (downloaded once, see `download_tiny_shakespeare`); else None."""
        if self.source and self.sha256 and Path(self.source).is_file() and sha256_of(self.source) == self.sha256:
            return Path(self.source)
        if self.is_tiny_shakespeare:
            return download_tiny_shakespeare()
        return None

    def missing_text_message(self) -> str:
        """Why the recorded text cannot be found, asking for it by name."""
        if not self.source:
            where = "its path was not recorded"
        elif not Path(self.source).is_file():
            where = f"it is no longer at {self.source}"
        else:
            where = f"{self.source} has changed since (its sha256 is not the recorded {self.sha256})"
        return f"this model was trained on {self.name} ({self.description}), but {where}"


def _checked_text(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"the corpus {what} must be a non-empty string, got {value!r}")
    if len(value) > MAX_RECORD_TEXT:
        raise ValueError(f"the corpus {what} is {len(value)} characters long; the limit is {MAX_RECORD_TEXT}")
    return value.strip()


def sample_prompts(text: str, n: int = SAMPLE_PROMPTS, max_chars: int = PROMPT_CHARS) -> tuple[str, ...]:
    """`n` prompts drawn evenly from `text`: the starts of its paragraphs (a line after a blank line, or the first
    line), else of its lines, each cut to about `max_chars` at a line end or a space; prompts of the training split
    only, so none is a line the validation measures."""
    train = train_val_split(text)[0] if len(text) >= 10 else text
    lines = train.split("\n")
    paragraphs = [i for i, line in enumerate(lines) if line.strip() and (i == 0 or not lines[i - 1].strip())]
    starts = paragraphs if len(paragraphs) >= n else [i for i, line in enumerate(lines) if line.strip()]
    picked = [starts[k * len(starts) // n] for k in range(n)] if len(starts) > n else starts
    prompts = [_prompt_at(lines, i, max_chars) for i in picked]
    return tuple(dict.fromkeys(p for p in prompts if p))


def _prompt_at(lines: list[str], i: int, max_chars: int) -> str:
    """The paragraph from line `i` on, cut to about `max_chars`: at a line end, else at a space, else at
    `max_chars`."""
    block = []
    for line in lines[i : i + 4]:
        if block and not line.strip():
            break
        block.append(line)
    text = "\n".join(block).rstrip()
    if len(text) <= max_chars:
        return text
    head = text[:max_chars]
    cut = head.rfind("\n")
    if cut < max_chars // 3:
        cut = head.rfind(" ")
    return (head[:cut] if cut >= max_chars // 3 else head).rstrip()


def read_corpus_record(folder: str | os.PathLike) -> CorpusRecord | None:
    """The model folder's `corpus.json`, or None when it has none; a ValueError naming a broken one."""
    path = Path(folder) / CORPUS_FILE_NAME
    if not path.exists():
        return None
    check_regular(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read {path}: {e}") from None
    return CorpusRecord.from_dict(data, str(path))


def write_corpus_record(folder: str | os.PathLike, record: CorpusRecord) -> Path:
    path = Path(folder) / CORPUS_FILE_NAME
    path.write_text(record.to_json(), encoding="utf-8")
    return path
