"""Chat as a play script: a model's chat format (`ChatFormat`), written once as the server's renderer (`render`) and
once as the Jinja template every other tool reads (`chat_template`, saved as the folder's `chat_template.jinja`).

Tiny Shakespeare is speeches, each a speaker's name and a colon on a line of its own, the lines, then a blank line:

    ROMEO:
    But, soft! what light through yonder window breaks?

    JULIET:
    Ay me!

So a conversation is written that way: each message is a speech, its speaker the message's `name` (`_` read as a
space, upper-cased where the format says so) or the speaker of its role, and the reply is the assistant's next
speech: the prompt ends with the assistant's heading (`JULIET:` and a newline), and the reply ends where the speech
does, at the blank line before the next speaker (`END_OF_SPEECH`, a stop string). A system message is a prologue:
its text alone at the top, with no speaker. Blank lines inside a message would end its speech early, so they are
written as single newlines. A request may name other speakers (`speakers`, e.g. `{"user": "KING HENRY"}`).

The speakers are the model's: a folder records its format in `tokenizer_config.json` (`chat_format`, the
tokenizer's argument; `null`: none), Shakespeare's ROMEO and JULIET; a model trained on another text gets
`User`/`Assistant` (`format_for_text`). Pure Python: the ONNX Runtime path reads it too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..files import check_regular, read_json_object

ROLES = ("system", "user", "assistant")
END_OF_SPEECH = "\n\n"
MAX_MESSAGES = 256
MAX_NAME = 64
_FIRST = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_NAME_CHARS = _FIRST + "0123456789 _'.-"


class ChatError(ValueError):
    """A conversation refused, with a message for its sender; `field` names the bad field."""

    def __init__(self, message: str, field: str = "messages"):
        super().__init__(message)
        self.field = field


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text):,} characters)"


@dataclass(frozen=True)
class ChatFormat:
    """Who speaks for each role (`system` None: a prologue without a speaker), and whether the names a request gives
    (a message's `name`, its `speakers`) are upper-cased, as a play's headings are."""

    user: str = "ROMEO"
    assistant: str = "JULIET"
    system: str | None = None
    upper_names: bool = True

    @classmethod
    def from_record(cls, record: Any, where: str = "chat_format") -> ChatFormat:
        """The format a folder records (a mapping of `ChatFormat`'s fields); ValueError naming `where` otherwise."""
        if not isinstance(record, Mapping) or not set(record) <= set(asdict(cls())):
            raise ValueError(f"{where} must map {list(asdict(cls()))} to values, got {_show(record)}")
        fmt = cls(**record)
        for role in ROLES:
            name = getattr(fmt, role)
            if (role != "system" or name is not None) and not _valid_name(name):
                raise ValueError(f"{where}.{role}: {_NAME_RULE}, got {_show(name)}")
        if not isinstance(fmt.upper_names, bool):
            raise ValueError(f"{where}.upper_names must be true or false, got {_show(fmt.upper_names)}")
        return fmt

    def record(self) -> dict[str, Any]:
        return asdict(self)

    def characters(self) -> set[str]:
        """The characters its template writes itself: the speakers' names, the colon, the newline."""
        return set("".join(n for n in (self.user, self.assistant, self.system) if n) + ":\n")

    def missing(self, chars) -> str:
        """Of `characters()`, those not in `chars` (a vocabulary), in order: empty when the model can read it all."""
        return "".join(sorted(self.characters() - set(chars)))


PLAY = ChatFormat()  # Tiny Shakespeare's, and a folder's that records none (what gpt-serve always rendered)
PLAIN = ChatFormat("User", "Assistant", None, upper_names=False)
_NAME_RULE = f"a speaker's name is 1-{MAX_NAME} letters, digits, spaces, _ ' . or -, starting with a letter"


_HEADING = re.compile(r"^([A-Z][A-Za-z' ]{0,40}):\n(?=\S)", re.M)  # a speaker's heading, its speech after it
PLAY_SPEAKERS = 3  # distinct speakers' headings that make a text a play


def format_for_text(text: str, chars=None) -> ChatFormat | None:
    """The format that fits a training text: the play's where it reads as one (speeches under `NAME:` headings, of at
    least `PLAY_SPEAKERS` speakers), else `User`/`Assistant` (or their upper or lower case) in the first spelling its
    characters (`chars`, default the text's) can write; None when none can (the folder then has no chat template)."""
    chars = set(text) if chars is None else set(chars)
    speakers_seen = set()
    for match in _HEADING.finditer(text):
        speakers_seen.add(match.group(1))
        if len(speakers_seen) >= PLAY_SPEAKERS:
            break
    if len(speakers_seen) >= PLAY_SPEAKERS and not PLAY.missing(chars):
        return PLAY
    for fmt in (PLAIN, ChatFormat("USER", "ASSISTANT"), ChatFormat("user", "assistant", None, False)):
        if not fmt.missing(chars):
            return fmt
    return None


def default_format(chars) -> ChatFormat | None:
    """The format of a folder that records none (written before formats were): the play's, which gpt-serve always
    rendered, where the vocabulary `chars` can write it; else none."""
    return None if PLAY.missing(chars) else PLAY


def _valid_name(name: Any) -> bool:
    return (
        isinstance(name, str)
        and 0 < len(name) <= MAX_NAME
        and name[0] in _FIRST
        and all(c in _NAME_CHARS for c in name)
    )


def speaker_name(name: Any, fmt: ChatFormat = PLAY, field: str = "name") -> str:
    """A speaker's name as a request gives it, as the heading writes it; ChatError naming `field` otherwise."""
    if not _valid_name(name):
        raise ChatError(f"{field}: {_NAME_RULE}, got {_show(name)}", field)
    name = name.replace("_", " ")
    return name.upper() if fmt.upper_names else name


def speakers(override: Any, fmt: ChatFormat = PLAY) -> dict[str, str | None]:
    """The speakers of the roles: the format's, with `override` (a mapping of role to a name) on top."""
    table = {"system": fmt.system, "user": fmt.user, "assistant": fmt.assistant}
    if override is None:
        return table
    if not isinstance(override, Mapping) or not all(role in ROLES for role in override):
        raise ChatError(f"speakers must map roles {list(ROLES)} to speaker names, got {_show(override)}", "speakers")
    for role, name in override.items():  # only the system role may have no speaker
        table[role] = None if name is None and role == "system" else speaker_name(name, fmt, "speakers")
    return table


def _content(message: Mapping, index: int) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI's content parts: only text here
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ChatError(f"messages[{index}].content: only text parts are supported, got {_show(part)}")
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise ChatError(f"messages[{index}].content must be text, got {_show(content)}")
    # a line of whitespace alone between two lines would end the speech: dropped (the template does the same)
    lines = content.strip("\n").split("\n")
    return "\n".join(line for i, line in enumerate(lines) if i in (0, len(lines) - 1) or line.strip())


def render(messages: Any, override: Any = None, fmt: ChatFormat = PLAY) -> str:
    """The prompt of a conversation (see the module docstring): its speeches, then the assistant's heading.
    `chat_template(fmt)` renders the same text with `add_generation_prompt=True` (a test holds them to it)."""
    if not isinstance(messages, list) or not messages:
        raise ChatError("messages must be a non-empty list of {role, content} objects")
    if len(messages) > MAX_MESSAGES:
        raise ChatError(f"messages holds {len(messages)} messages; the limit is {MAX_MESSAGES}")
    table = speakers(override, fmt)
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise ChatError(f"messages[{i}] must be an object with role and content")
        role = message.get("role")
        if role == "developer":  # OpenAI's newer name for the system role
            role = "system"
        if role not in ROLES:
            raise ChatError(f"messages[{i}].role must be one of {list(ROLES)}, got {_show(role)}")
        text = _content(message, i)
        speaker = speaker_name(message["name"], fmt) if message.get("name") is not None else table[role]
        out.append(f"{speaker}:\n{text}{END_OF_SPEECH}" if speaker else f"{text}{END_OF_SPEECH}")
    return "".join(out) + f"{table['assistant']}:\n"


# The template: `render` in Jinja, for transformers' `apply_chat_template` (and vLLM's and TGI's chat, which call it).
# `speakers` (a template keyword: `apply_chat_template(..., speakers={...})`, vLLM's `chat_template_kwargs`) is the
# request's override. Errors are `raise_exception`, transformers' own; the message limit is the server's alone.
_TEMPLATE = """\
{#- gpt-serve's chat format: each message a speech, a speaker's heading (NAME:), its lines, a blank line; the reply
    is the assistant's next speech and ends at the next blank line. Written by gpt_serve/chargpt/chat_format.py. -#}
{%- set first = <<FIRST>> -%}
{%- set allowed = <<ALLOWED>> -%}
{%- macro speaker(name, field) -%}
  {%- if name is not string or name | length == 0 or name | length > <<MAX_NAME>> or name[0] not in first -%}
    {{- raise_exception(field + ': ' + <<RULE>> + ', got ' + (name | string)) -}}
  {%- endif -%}
  {%- for c in name -%}
    {%- if c not in allowed -%}{{- raise_exception(field + ': ' + <<RULE>> + ', got ' + name) -}}{%- endif -%}
  {%- endfor -%}
  {{- name | replace('_', ' ') | <<UPPER>> -}}
{%- endmacro -%}
{%- set ns = namespace(system=<<SYSTEM>>, user=<<USER>>, assistant=<<ASSISTANT>>, text='') -%}
{%- if speakers is defined and speakers is not none -%}
  {%- if speakers is not mapping -%}{{- raise_exception('speakers must map roles to speaker names') -}}{%- endif -%}
  {%- for role, name in speakers.items() -%}
    {%- if role == 'system' and name is none -%}{%- set ns.system = none -%}
    {%- elif role == 'system' -%}{%- set ns.system = speaker(name, 'speakers') -%}
    {%- elif role == 'user' -%}{%- set ns.user = speaker(name, 'speakers') -%}
    {%- elif role == 'assistant' -%}{%- set ns.assistant = speaker(name, 'speakers') -%}
    {%- else -%}{{- raise_exception('speakers must map roles system, user, assistant to speaker names') -}}
    {%- endif -%}
  {%- endfor -%}
{%- endif -%}
{%- if messages is string or messages | length == 0 -%}
  {{- raise_exception('messages must be a non-empty list of {role, content} objects') -}}
{%- endif -%}
{%- for message in messages -%}
  {%- set role = 'system' if message.role == 'developer' else message.role -%}
  {%- if role not in ['system', 'user', 'assistant'] -%}
    {{- raise_exception('messages[' ~ loop.index0 ~ '].role must be one of system, user, assistant') -}}
  {%- endif -%}
  {%- if message.content is string -%}
    {%- set ns.text = message.content -%}
  {%- elif message.content is defined and message.content is iterable and message.content is not mapping
    and message.content is not none -%}
    {%- set ns.text = '' -%}
    {%- for part in message.content -%}
      {%- if part is not mapping or part.type != 'text' or part.text is not string -%}
        {{- raise_exception('messages[' ~ loop.index0 ~ '].content: only text parts are supported') -}}
      {%- endif -%}
      {%- set ns.text = ns.text + part.text -%}
    {%- endfor -%}
  {%- else -%}
    {{- raise_exception('messages[' ~ loop.index0 ~ '].content must be text') -}}
  {%- endif -%}
  {%- if message.name is defined and message.name is not none -%}
    {%- set who = speaker(message.name, 'name') -%}
  {%- elif role == 'system' -%}{%- set who = ns.system -%}
  {%- elif role == 'user' -%}{%- set who = ns.user -%}
  {%- else -%}{%- set who = ns.assistant -%}
  {%- endif -%}
  {%- if who -%}{{- who + ':\\n' -}}{%- endif -%}
  {%- set lines = ns.text.strip('\\n').split('\\n') -%}
  {%- for line in lines -%}
    {%- if loop.first -%}{{- line -}}
    {%- elif loop.last or line.strip() -%}{{- '\\n' + line -}}
    {%- endif -%}
  {%- endfor -%}
  {{- '\\n\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- ns.assistant + ':\\n' -}}{%- endif -%}
"""


def _literal(value: str | None) -> str:
    if value is None:
        return "none"
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def chat_template(fmt: ChatFormat) -> str:
    """The Jinja chat template of `fmt` (what `render` writes, with the generation prompt when asked for)."""
    fills = {
        "FIRST": _literal(_FIRST),
        "ALLOWED": _literal(_NAME_CHARS),
        "MAX_NAME": str(MAX_NAME),
        "RULE": _literal(_NAME_RULE),
        "UPPER": "upper" if fmt.upper_names else "string",
        "SYSTEM": _literal(fmt.system),
        "USER": _literal(fmt.user),
        "ASSISTANT": _literal(fmt.assistant),
    }
    return re.sub(r"<<(\w+)>>", lambda m: fills[m.group(1)], _TEMPLATE)


TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"


def read_chat_format(folder: str | os.PathLike, chars) -> ChatFormat | None:
    """The chat format a model folder records (`tokenizer_config.json`'s `chat_format`; a folder that records none
    gets `default_format`), checked: its speakers in the vocabulary `chars`, and the folder's `chat_template.jinja`,
    where there is one, its template. None: the model has no chat format. ValueError naming the file otherwise."""
    folder = Path(folder)
    path = folder / TOKENIZER_CONFIG_FILE
    config = read_json_object(path) or {}
    if "chat_format" not in config:
        return default_format(chars)
    if config["chat_format"] is None:
        return None
    fmt = ChatFormat.from_record(config["chat_format"], f"{path}: chat_format")
    missing = fmt.missing(chars)
    if missing:
        raise ValueError(f"{path}: chat_format writes characters the model's vocabulary lacks: {missing!r}")
    template = check_regular(folder / TEMPLATE_FILE)
    if template.is_file() and template.read_text(encoding="utf-8") != chat_template(fmt):
        raise ValueError(
            f"{template} is not the template of {path}'s chat_format {fmt.record()}: other tools would chat with "
            f"the model in another format; write the folder again (gpt-serve copy)"
        )
    return fmt
