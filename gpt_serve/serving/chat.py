"""Chat for the API: OpenAI chat messages become the model's play script (`gpt_serve.chargpt.chat_format`, which
the folder's `chat_template.jinja` renders the same way), its errors the request specification's `RequestError`."""

from __future__ import annotations

from typing import Any

from ..chargpt.chat_format import END_OF_SPEECH, PLAY, ChatError, ChatFormat
from ..chargpt.chat_format import render as render_format
from ..generation.fields import RequestError

__all__ = ["END_OF_SPEECH", "render"]


def render(messages: Any, override: Any = None, fmt: ChatFormat = PLAY) -> str:
    """The prompt of a conversation in the model's format `fmt` (`speakers` of the request: `override`);
    RequestError naming the bad field otherwise."""
    try:
        return render_format(messages, override, fmt)
    except ChatError as e:
        raise RequestError(str(e), e.field) from None
