"""CharTokenizer: the lesson's character tokenizer as a transformers tokenizer.

The vocabulary is `sorted(set(corpus))` (ids = the lesson's), stored in `vocab.json` and handled by `CharVocab`.
A `<pad>` special token is appended after the characters (id = number of characters) so batches can be padded;
the model never embeds it (it embeds padding positions as id 0 and masks them out).

`vocab.json` is the one source of truth. Saving also writes `tokenizer.json`, the same table for the `tokenizers`
library (a normalizer that replaces characters outside the vocabulary, a `WordLevel` model, every character its own
piece, a `Fuse` decoder), which transformers without this package (`AutoTokenizer` gives a `TokenizersBackend` with
the same ids), transformers.js and Rust read. Loading refuses a folder whose two files disagree.
"""

from __future__ import annotations

import os

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizer

from .chat_format import ChatFormat, chat_template, default_format, format_for_text
from .vocab import FAST_TOKENIZER_FILE_NAME, UNK_POLICIES, VOCAB_FILE_NAME, CharVocab

PAD_TOKEN = "<pad>"


def outside_vocabulary(chars) -> str:
    """A regular expression of one character outside `chars` (a negated class, escaped for Oniguruma, which
    `tokenizers` uses, and for JavaScript's RegExp, which transformers.js uses)."""
    special = set("\\]^-[&")
    return "[^" + "".join("\\n" if c == "\n" else "\\" + c if c in special else c for c in chars) + "]"


def fast_tokenizer(vocab: CharVocab) -> Tokenizer:
    """`vocab` as a `tokenizers.Tokenizer` with the same ids (and `<pad>` after the characters).

    A `WordLevel` model (what `tokenizer.json` holds) behind a normalizer that applies the package's unknown-character
    policy: each character outside the vocabulary becomes `vocab.unk_replacement` (a space), as
    `vocab.encode(text, "replace")` does, or is removed where `vocab.unk_policy` is `"drop"`. A file cannot refuse
    with a message, so the default `"error"` policy is written as `"replace"`: every runtime that reads the file
    (transformers without gpt_serve, `tokenizers`, transformers.js) gives the ids gpt_serve gives with
    `unk_policy="replace"`, and onnxruntime-genai's `onnx/tokenizer.json` (a byte-level BPE over the same ids,
    written by the export) does the same.
    """
    tokenizer = Tokenizer(models.WordLevel(vocab=dict(vocab.stoi), unk_token=None))
    replacement = "" if vocab.unk_policy == "drop" else vocab.unk_replacement
    tokenizer.normalizer = normalizers.Replace(Regex(outside_vocabulary(vocab.chars)), replacement)
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), "isolated")  # one piece per character
    tokenizer.decoder = decoders.Fuse()  # join the pieces without spaces
    tokenizer.add_special_tokens([PAD_TOKEN])
    return tokenizer


class CharTokenizer(PreTrainedTokenizer):
    """One token per character.

    Args:
        vocab_file: path of a `vocab.json` mapping each character to its id.
        tokenizer_file: the `tokenizer.json` beside it, if any: checked against `vocab_file`.
        chars: the characters in id order, instead of `vocab_file` (see also `from_corpus`).
        unk_policy: characters outside the vocabulary: `"error"` (default) raises a `ValueError` naming them and
            their positions; `"drop"` removes them; `"replace"` maps them to `unk_replacement`.
        unk_replacement: the character `"replace"` uses (default: a space).
        chat_format: the model's chat format (`gpt_serve.chargpt.chat_format.ChatFormat`, or its record as
            `tokenizer_config.json` holds it; None: no chat; "auto", the default: the play's ROMEO and JULIET where the
            vocabulary can write them, else none). Its template is
            the tokenizer's `chat_template` (saved as `chat_template.jinja`); a different one is refused.
    """

    vocab_files_names = {"vocab_file": VOCAB_FILE_NAME, "tokenizer_file": FAST_TOKENIZER_FILE_NAME}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(
        self,
        vocab_file: str | None = None,
        tokenizer_file: str | None = None,
        chars: list[str] | None = None,
        unk_policy: str = "error",
        unk_replacement: str | None = None,
        chat_format: ChatFormat | dict | str | None = "auto",
        **kwargs,
    ):
        if (vocab_file is None) == (chars is None):
            raise ValueError("CharTokenizer needs exactly one of vocab_file or chars")
        if vocab_file is not None:
            self.vocab = CharVocab.from_file(vocab_file, unk_policy=unk_policy, unk_replacement=unk_replacement)
        else:
            self.vocab = CharVocab(chars, unk_policy=unk_policy, unk_replacement=unk_replacement)
        if tokenizer_file is not None and vocab_file is not None:
            self.vocab.check_tokenizer_file(tokenizer_file, vocab_file)
        for loading_only in ("is_local", "local_files_only"):  # from_pretrained's, not the tokenizer's: not saved
            kwargs.pop(loading_only, None)
        kwargs.setdefault("pad_token", PAD_TOKEN)
        kwargs.setdefault("padding_side", "left")  # generation pads on the left
        kwargs.setdefault("model_max_length", int(1e30))
        fmt = self._chat_format(chat_format, kwargs)
        record = None if fmt is None else fmt.record()
        super().__init__(
            unk_policy=unk_policy, unk_replacement=self.vocab.unk_replacement, chat_format=record, **kwargs
        )
        self.chat_format = record  # what save_pretrained writes into tokenizer_config.json (`ChatFormat.record`)

    def _chat_format(self, chat_format, kwargs: dict) -> ChatFormat | None:
        """The format `chat_format` names, checked against the vocabulary; its template set as `chat_template`
        (where the folder gave one, the same is required)."""
        if chat_format == "auto":
            chat_format = default_format(self.vocab.chars)
        if chat_format is None:
            return None
        fmt = chat_format if isinstance(chat_format, ChatFormat) else ChatFormat.from_record(chat_format)
        missing = fmt.missing(self.vocab.chars)
        if missing:
            raise ValueError(
                f"chat_format {fmt.record()} writes characters the vocabulary lacks ({missing!r}); choose speakers "
                f"in its characters, or chat_format=None for no chat"
            )
        template = chat_template(fmt)
        given = kwargs.get("chat_template")
        if given is not None and given != template:
            raise ValueError(
                "the chat_template (a folder's chat_template.jinja) is not the template of chat_format "
                f"{fmt.record()} (tokenizer_config.json); write the folder again with save_pretrained"
            )
        kwargs["chat_template"] = template
        return fmt

    @classmethod
    def from_corpus(cls, text: str, **kwargs) -> CharTokenizer:
        """The lesson's vocabulary: every distinct character of `text`, sorted; the chat format that fits the text
        (`format_for_text`) unless `chat_format` is given."""
        chars = CharVocab.from_text(text).chars
        kwargs.setdefault("chat_format", format_for_text(text, chars))
        return cls(chars=chars, **kwargs)

    @property
    def unk_policy(self) -> str:
        return self.vocab.unk_policy

    @unk_policy.setter
    def unk_policy(self, value: str) -> None:
        if value not in UNK_POLICIES:
            raise ValueError(f"unk_policy must be one of {UNK_POLICIES}, got {value!r}")
        self.vocab.unk_policy = value

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def get_vocab(self) -> dict[str, int]:
        return {**self.vocab.stoi, **self.added_tokens_encoder}

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return list(self.vocab.clean(text))

    def _convert_token_to_id(self, token: str) -> int:
        return self.vocab.stoi[token]

    def _convert_id_to_token(self, index: int) -> str:
        return self.vocab.chars[index]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return "".join(tokens)

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple[str, str]:
        """Writes `vocab.json` and, derived from it, `tokenizer.json`."""
        if not os.path.isdir(save_directory):
            raise ValueError(f"save_vocabulary needs an existing directory, got {save_directory!r}")
        prefix = filename_prefix + "-" if filename_prefix else ""
        vocab_path = os.path.join(save_directory, prefix + VOCAB_FILE_NAME)
        fast_path = os.path.join(save_directory, prefix + FAST_TOKENIZER_FILE_NAME)
        self.vocab.save(vocab_path)
        fast_tokenizer(self.vocab).save(fast_path)
        return vocab_path, fast_path


# No `register_for_auto_class("AutoTokenizer")`: a folder's tokenizer_config.json then has no `auto_map`, so
# `AutoTokenizer` loads `tokenizer.json` without remote code (and without this package) instead of asking for
# `trust_remote_code`; with this package registered, it gives a `CharTokenizer` (see `register_auto_classes`).

__all__ = ["CharTokenizer"]
