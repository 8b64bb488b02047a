"""Chat as a play script: OpenAI chat messages become the model's own format, the lines of a play.

Tiny Shakespeare is speeches, each a speaker's name and a colon on a line of its own, the lines, then a blank line:

    ROMEO:
    But, soft! what light through yonder window breaks?

    JULIET:
    Ay me!

So a conversation is written that way: each message is a speech, its speaker the message's `name` (upper-cased,
`_` read as a space) or the default of its role (`DEFAULT_SPEAKERS`: the user is ROMEO, the assistant JULIET), and
the reply is the assistant's next speech: the prompt ends with `JULIET:` and a newline, and the reply ends where
the speech does, at the blank line before the next speaker (`END_OF_SPEECH`, a stop string). A system message is
a prologue: its text alone at the top, with no speaker. Blank lines inside a message would end its speech early,
so they are written as single newlines. A request may name other speakers (`speakers`, e.g. `{"user": "KING
HENRY", "assistant": "FALSTAFF"}`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..generation.fields import RequestError, show_value

DEFAULT_SPEAKERS = {"system": None, "user": "ROMEO", "assistant": "JULIET"}
ROLES = ("system", "user", "assistant")
END_OF_SPEECH = "\n\n"
MAX_MESSAGES = 256
_BLANK_LINES = re.compile(r"\n\s*\n+")
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9 _'.-]{0,63}")


def speakers(override: Any) -> dict[str, str | None]:
    """The speakers of the roles: the defaults, with `override` (a mapping of role to a name) on top."""
    table = dict(DEFAULT_SPEAKERS)
    if override is None:
        return table
    if not isinstance(override, Mapping) or not all(role in ROLES for role in override):
        raise RequestError(f"speakers must map roles {list(ROLES)} to speaker names, got {show_value(override)}")
    for role, name in override.items():  # only the system role may have no speaker
        table[role] = None if name is None and role == "system" else speaker_name(name, "speakers")
    return table


def speaker_name(name: Any, field: str = "name") -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise RequestError(
            f"{field}: a speaker's name is 1-64 letters, digits, spaces, _ ' . or -, starting with a letter, "
            f"got {show_value(name)}",
            field,
        )
    return name.replace("_", " ").upper()


def _content(message: Mapping, index: int) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI's content parts: only text here
        parts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"messages[{index}].content: only text parts are supported, got {show_value(part)}")
            parts.append(part["text"])
        content = "".join(parts)
    if not isinstance(content, str):
        raise RequestError(f"messages[{index}].content must be text, got {show_value(content)}", "messages")
    return _BLANK_LINES.sub("\n", content.strip("\n"))


def render(messages: Any, override: Any = None) -> str:
    """The prompt of a conversation (see the module docstring): its speeches, then the assistant's heading."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
    if len(messages) > MAX_MESSAGES:
        raise RequestError(f"messages holds {len(messages)} messages; the limit is {MAX_MESSAGES}", "messages")
    table = speakers(override)
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise RequestError(f"messages[{i}] must be an object with role and content", "messages")
        role = message.get("role")
        if role == "developer":  # OpenAI's newer name for the system role
            role = "system"
        if role not in ROLES:
            raise RequestError(f"messages[{i}].role must be one of {list(ROLES)}, got {show_value(role)}", "messages")
        text = _content(message, i)
        speaker = speaker_name(message["name"]) if message.get("name") is not None else table[role]
        out.append(f"{speaker}:\n{text}{END_OF_SPEECH}" if speaker else f"{text}{END_OF_SPEECH}")
    return "".join(out) + f"{table['assistant']}:\n"
