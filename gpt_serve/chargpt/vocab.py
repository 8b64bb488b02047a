"""CharVocab: the character vocabulary on its own, in pure Python.

It is the one place that maps characters to ids. The transformers tokenizer (`tokenization_chargpt`) wraps it,
and the torch-free ONNX Runtime path uses it directly, so both read the same `vocab.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable

from ..files import check_regular, read_json_file

VOCAB_FILE_NAME = "vocab.json"
# The same table for the `tokenizers` library, derived from vocab.json when a tokenizer is saved.
FAST_TOKENIZER_FILE_NAME = "tokenizer.json"
UNK_POLICIES = ("error", "drop", "replace")


class CharVocab:
    """Characters <-> ids, the lesson's way: sorted unique characters, id = rank.

    Args:
        chars: the vocabulary, in id order. Each must be one distinct character.
        unk_policy: what `encode` does with characters outside the vocabulary: `"error"` raises a `ValueError`
            naming them and their positions, `"drop"` removes them, `"replace"` maps them to `unk_replacement`.
        unk_replacement: the in-vocabulary character used by `unk_policy="replace"` (default: a space, or the
            first character when the vocabulary has no space).
    """

    def __init__(self, chars: Iterable[str], unk_policy: str = "error", unk_replacement: str | None = None):
        chars = list(chars)
        if not chars:
            raise ValueError("a character vocabulary needs at least one character, got none")
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
        if bad:
            raise ValueError(f"every vocabulary entry must be a single character, got {bad[:5]!r}")
        if len(set(chars)) != len(chars):
            dupes = sorted({c for c in chars if chars.count(c) > 1})
            raise ValueError(f"vocabulary has duplicate characters: {dupes!r}")
        if unk_policy not in UNK_POLICIES:
            raise ValueError(f"unk_policy must be one of {UNK_POLICIES}, got {unk_policy!r}")
        if unk_replacement is None:
            unk_replacement = " " if " " in chars else chars[0]
        if unk_replacement not in chars:
            raise ValueError(f"unk_replacement {unk_replacement!r} is not in the vocabulary")
        self.chars = chars
        self.stoi = {c: i for i, c in enumerate(chars)}
        self.unk_policy = unk_policy
        self.unk_replacement = unk_replacement

    @classmethod
    def from_text(cls, text: str, **kwargs) -> CharVocab:
        """The lesson's vocabulary: `sorted(set(text))`."""
        if not text:
            raise ValueError("cannot build a vocabulary from empty text")
        return cls(sorted(set(text)), **kwargs)

    @classmethod
    def from_file(cls, path: str | os.PathLike, **kwargs) -> CharVocab:
        """Reads a `vocab.json` ({character: id}) as written by `save`."""
        try:
            mapping = read_json_file(path)  # at most 64 MiB (`gpt_serve.files.json_max_bytes`)
        except FileNotFoundError:
            raise FileNotFoundError(f"vocabulary file not found: {path}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"vocabulary file {path} is not valid JSON: {e}") from None
        if not isinstance(mapping, dict) or sorted(mapping.values()) != list(range(len(mapping))):
            raise ValueError(f"vocabulary file {path} must map each character to a distinct id 0..n-1")
        return cls(sorted(mapping, key=mapping.__getitem__), **kwargs)

    def save(self, path: str | os.PathLike) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.stoi, f, ensure_ascii=False, indent=0)
            f.write("\n")

    def __len__(self) -> int:
        return len(self.chars)

    @property
    def sha256(self) -> str:
        """A hash of the id -> character mapping: two vocabularies with the same hash encode alike."""
        return hashlib.sha256("".join(self.chars).encode("utf-8")).hexdigest()

    def check_tokenizer_file(self, path: str | os.PathLike, vocab_file: str | os.PathLike = VOCAB_FILE_NAME) -> None:
        """A ValueError unless the `tokenizer.json` at `path` maps the characters as this vocabulary does."""
        check_regular(path)
        try:
            table = dict(read_json_file(path)["model"]["vocab"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path} is not a readable tokenizers file ({type(e).__name__}: {e})") from None
        if table != self.stoi:
            differ = sorted(set(table.items()) ^ set(self.stoi.items()), key=repr)[:6]
            raise ValueError(
                f"{path} and {vocab_file} disagree on the vocabulary ({len(table)} vs {len(self)} entries; "
                f"differing (character, id) pairs include {differ}). {os.path.basename(vocab_file)} is the source: "
                f"delete {os.path.basename(path)} and save the tokenizer again to rewrite it."
            )

    def unknown(self, text: str, shown: int = 10) -> tuple[int, list[tuple[int, str]]]:
        """How many characters of `text` are outside the vocabulary, and the first `shown` of them as (position,
        character): bounded whatever the text's length, so an error made of it keeps nothing of a huge text."""
        stoi = self.stoi
        if set(text).issubset(stoi):
            return 0, []
        count, first = 0, []
        for i, c in enumerate(text):
            if c not in stoi:
                count += 1
                if len(first) < shown:
                    first.append((i, c))
        return count, first

    def clean(self, text: str, unk_policy: str | None = None) -> str:
        """`text` with unknown characters handled by `unk_policy` (default: this vocabulary's policy)."""
        policy = unk_policy or self.unk_policy
        if policy not in UNK_POLICIES:
            raise ValueError(f"unk_policy must be one of {UNK_POLICIES}, got {policy!r}")
        count, first = self.unknown(text)
        if not count:
            return text
        if policy == "error":
            shown = ", ".join(f"{c!r} at {i}" for i, c in first)
            more = f" and {count - len(first)} more" if count > len(first) else ""
            raise ValueError(
                f"text has {count} character{'s' if count > 1 else ''} outside the vocabulary: {shown}{more}. "
                f"Use unk_policy='drop' or 'replace' to accept them."
            )
        replacement = "" if policy == "drop" else self.unk_replacement
        return "".join(c if c in self.stoi else replacement for c in text)

    def encode(self, text: str, unk_policy: str | None = None) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return [self.stoi[c] for c in self.clean(text, unk_policy)]

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.chars):
                raise ValueError(f"token id {i} is outside the vocabulary [0, {len(self.chars) - 1}]")
            out.append(self.chars[i])
        return "".join(out)
