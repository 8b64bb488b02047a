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
import re
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..files import check_regular, read_small, write_file
from ..models import CORPUS_FILE_NAME

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


# -- what a model folder records of its text ----------------------------------------------------------------------

CORPUS_MAX_BYTES = 64 * 1024  # a record is a few hundred bytes; a larger corpus.json is refused unread
SAMPLE_PROMPTS = 5  # how many sample prompts a record draws from its text
PROMPT_CHARS = 48  # about the longest sample prompt, in characters (cut at a space or a line end)
MAX_PROMPTS = 16  # the most prompts a record holds (its own, or written by hand)
MAX_PROMPT_CHARS = 500  # the longest prompt a record holds, in characters
MAX_RECORD_TEXT = 500  # the longest name or description a record takes, in characters
MAX_SOURCE_CHARS = 4096  # the longest source path (PATH_MAX on Linux)
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
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class CorpusRecord:
    """What a model folder records of the text it was trained on (`corpus.json`), so that every surface can present
    the model it serves (the demo's title, intro and examples, the card's snippets, the CLI's default prompt) and the
    export can validate on that text again without being told where it is.

    Every record is checked when it is made (`__post_init__`), however it is made: a record that exists is one
    `read_corpus_record` reads back.

    Args:
        name: what the text is called ("Tiny Shakespeare", "my_code.txt"): one line, at most `MAX_RECORD_TEXT`
            characters, stripped.
        description: one short sentence about it (the same limits).
        prompts: a few sample prompts, starts of real lines of the text (the first is a surface's default prompt):
            at most `MAX_PROMPTS`, each 1 to `MAX_PROMPT_CHARS` characters.
        sha256: the sha256 (64 lowercase hex digits) of the text's UTF-8 bytes as Python reads it (newlines
            translated: a file with CRLF line ends hashes as its text with LF); None when not known, e.g. an import
            given no text.
        source: the absolute path the text was read from (None when not known).
        characters: its length in characters, a non-negative integer (None when not known).
    """

    name: str
    description: str
    prompts: tuple[str, ...] = ()
    sha256: str | None = None
    source: str | None = None
    characters: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", _one_line("name", self.name))
        object.__setattr__(self, "description", _one_line("description", self.description))
        if isinstance(self.prompts, str) or not isinstance(self.prompts, (list, tuple)):
            raise ValueError(f"'prompts' must be a list of strings, got {_shown(self.prompts)}")
        prompts = tuple(self.prompts)
        if len(prompts) > MAX_PROMPTS:
            raise ValueError(f"'prompts' holds {len(prompts)} prompts; a record holds at most {MAX_PROMPTS}")
        for prompt in prompts:
            if not isinstance(prompt, str) or not 1 <= len(prompt) <= MAX_PROMPT_CHARS:
                raise ValueError(
                    f"each prompt must be a string of 1 to {MAX_PROMPT_CHARS} characters, got {_shown(prompt)}"
                )
        object.__setattr__(self, "prompts", prompts)
        if self.sha256 is not None and not (isinstance(self.sha256, str) and _SHA256.fullmatch(self.sha256)):
            raise ValueError(f"'sha256' must be 64 lowercase hex digits or null, got {_shown(self.sha256)}")
        if self.source is not None and not (
            isinstance(self.source, str) and len(self.source) <= MAX_SOURCE_CHARS and "\0" not in self.source
            and os.path.isabs(self.source)
        ):  # fmt: skip
            raise ValueError(f"'source' must be an absolute path or null, got {_shown(self.source)}")
        chars = self.characters
        if chars is not None and (isinstance(chars, bool) or not isinstance(chars, int) or chars < 0):
            raise ValueError(f"'characters' must be a non-negative integer or null, got {_shown(chars)}")

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
        digest = text_sha256(text)
        shakespeare = digest == TINY_SHAKESPEARE_SHA256
        if shakespeare and name is None and description is None:
            return cls.tiny_shakespeare(path)
        if name is None:
            name = TINY_SHAKESPEARE_NAME if shakespeare else (record_text(Path(path).name) if path else "")
            name = name or "the training text"
        if description is None:
            description = TINY_SHAKESPEARE_DESCRIPTION if shakespeare else f"{len(text):,} characters of text"
        prompts = TINY_SHAKESPEARE_PROMPTS if shakespeare else sample_prompts(text)
        source = str(Path(path).resolve()) if path else None
        return cls(name, description, prompts, digest, source, len(text))

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

    def public(self) -> dict[str, Any]:
        """What a page may show of the record: its name, description and prompts (not where the text lives)."""
        return {"name": self.name, "description": self.description, "prompts": list(self.prompts)}

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, ensure_ascii=False) + "\n"

    @classmethod
    def from_dict(cls, data: Any, where: str = CORPUS_FILE_NAME) -> CorpusRecord:
        """A record from its JSON object (the checks are the record's own); a ValueError naming what is wrong."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} must hold a JSON object, got a {type(data).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields, key=repr)
        if unknown:
            raise ValueError(f"{where} has unknown fields {unknown[:5]}; a record has {sorted(fields)}")
        missing = [key for key in ("name", "description") if key not in data]
        if missing:
            raise ValueError(f"{where} lacks {missing}")
        try:
            return cls(**data)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

    def find_text(self) -> str | None:
        """The recorded text, if it is still where it was read from with the same sha256 (read as training read
        it, and hashed as training hashed it: the text returned is the text checked); Tiny Shakespeare from the
        user cache otherwise (downloaded once, see `download_tiny_shakespeare`); else None."""
        text = self._read_source()
        if text is not None:
            return text
        if self.is_tiny_shakespeare:
            return load_text(None)
        return None

    def _read_source(self) -> str | None:
        """The text at `source` when its sha256 is the recorded one, else None. A file whose size cannot hold
        `characters` characters (UTF-8 takes 1 to 4 bytes for one; a CRLF line end, 2 for one newline) is not
        read."""
        if not (self.source and self.sha256):
            return None
        try:
            size = os.stat(self.source).st_size
        except OSError:
            return None
        if self.characters is not None and not self.characters <= size <= 4 * self.characters:
            return None
        try:
            text = load_text(self.source)
        except (OSError, ValueError):
            return None
        return text if text_sha256(text) == self.sha256 else None

    def missing_text_message(self) -> str:
        """Why the recorded text cannot be found, asking for it by name."""
        if not self.source:
            where = "its path was not recorded"
        elif not Path(self.source).is_file():
            where = f"it is no longer at {self.source}"
        else:
            where = f"{self.source} has changed since (its sha256 is not the recorded {self.sha256})"
        return f"this model was trained on {self.name} ({self.description}), but {where}"


def text_sha256(text: str) -> str:
    """The sha256 a record keeps of a text: of its UTF-8 bytes as read (`load_text`: newlines translated)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def record_text(value: str, limit: int = MAX_RECORD_TEXT) -> str:
    """`value` made fit for a record's name or description: on one line, stripped, cut to `limit` characters
    (for a name found somewhere, e.g. a file's or a checkpoint's, that a record must take)."""
    value = " ".join("".join(c if c.isprintable() else " " for c in value).split())
    return value if len(value) <= limit else value[: limit - 1].rstrip() + "…"


def _one_line(what: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what!r} must be a non-empty string, got {_shown(value)}")
    value = value.strip()
    if len(value) > MAX_RECORD_TEXT:
        raise ValueError(f"{what!r} is {len(value):,} characters long; the limit is {MAX_RECORD_TEXT}")
    if any(not c.isprintable() and c != " " for c in value):
        raise ValueError(f"{what!r} must be one line of printable characters, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """`value` in a message: its repr, cut short."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


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


def read_corpus_record(folder: str | os.PathLike) -> CorpusRecord | None:
    """The model folder's `corpus.json`, or None when it has none; a ValueError naming a broken one (not a regular
    file, over `CORPUS_MAX_BYTES`, not UTF-8 JSON, nested too deep, or a record that fails its checks)."""
    path = Path(folder) / CORPUS_FILE_NAME
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = json.loads(read_small(path, CORPUS_MAX_BYTES).decode("utf-8"))
    except RecursionError:
        raise ValueError(f"cannot read {path}: its JSON is nested too deep for a corpus record") from None
    except (OSError, ValueError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ValueError(f"cannot read {path}: {e}") from None
    return CorpusRecord.from_dict(data, str(path))


def corpus_record_or_none(folder: str | os.PathLike) -> CorpusRecord | None:
    """The model folder's corpus record for a surface that presents the model (the demo, the browser page,
    `gpt-serve generate`'s default prompt): None when it has none, or when it cannot be read, which is logged as a
    warning, for the model is served all the same."""
    try:
        return read_corpus_record(folder)
    except (OSError, ValueError) as e:
        logger.warning("the corpus record of %s is ignored: %s", folder, e)
        return None


def write_corpus_record(folder: str | os.PathLike, record: CorpusRecord) -> Path:
    """Writes `record` as the model folder's `corpus.json` (whole, under a fresh name renamed over it; never through
    a link: `gpt_serve.files.write_file`) and returns its path."""
    return write_file(Path(folder) / CORPUS_FILE_NAME, record.to_json())
