"""What a model folder records of the text it was trained on (`corpus.json`): `CorpusRecord`, checked however it
is made, and its reading (refusing a broken file with one ValueError) and writing.

Torch-free, as `gpt_serve.folders.corpus` is: the demo, the server, the CLI, training and the export read it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..files import read_small, write_file
from ..models import CORPUS_FILE_NAME
from .corpus import TINY_SHAKESPEARE_SHA256, load_text, sample_prompts

logger = logging.getLogger(__name__)

CORPUS_MAX_BYTES = 64 * 1024  # a record is a few hundred bytes; a larger corpus.json is refused unread
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
