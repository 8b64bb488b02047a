"""The demo's form as data: the label, default and choices of each field a visitor sets, shared by the Gradio page
(`demo.app` builds its components from `FORM`) and the in-browser page (`demo/web/form.json` is `form_json()`, and a
test keeps the file in step), so that both pages ask the same questions with the same defaults. Their limits are
the request specification's (`gpt_serve.generation.spec`; the in-browser page reads them from `spec.json`).

    python -c "from demo.form import form_json; print(form_json(), end='')" > demo/web/form.json
"""

from __future__ import annotations

import json

from gpt_serve.chargpt.window import DEFAULT_WINDOW_MODE

WINDOW_CHOICES = [
    ("refill: restart the cache from the last block_size/2 tokens (fast)", "refill"),
    ("exact: the lesson's last block_size tokens (a full forward per token)", "exact"),
]
UNK_CHOICES = [
    ("stop with a message", "error"),
    ("replace each with a space", "replace"),
    ("drop them", "drop"),
]
# field (the request specification's name) -> its label, default and, for a choice, its (label, value) choices (and
# for unk_policy the words the message about unknown characters ends with, below)
FORM = {
    # the served model's first sample prompt replaces it (its folder's corpus.json); empty: after a newline
    "prompt": dict(label="Prompt", default=""),
    "max_new_tokens": dict(label="Max new tokens", default=300),
    "temperature": dict(label="Temperature (0 = greedy)", default=0.8),
    "top_k": dict(label="Top-k (0 = off)", default=0),
    "top_p": dict(label="Top-p (1 = off)", default=1.0),
    "seed": dict(label="Seed (-1 = random)", default=-1),
    "window_mode": dict(label="Past block_size", default=DEFAULT_WINDOW_MODE, choices=WINDOW_CHOICES),
    "unk_policy": dict(label="Characters outside the vocabulary", default="error", choices=UNK_CHOICES),
}
# How the pages accept characters outside the vocabulary, in their control's words (not the API's `unk_policy`): the
# end of the message about them (`gpt_serve.generation.text.encode_prompt`'s `unk_hint`), on both pages.
_UNK = {value: label for label, value in UNK_CHOICES}
FORM["unk_policy"]["hint"] = (
    f'choose "{_UNK["replace"]}" or "{_UNK["drop"]}" under "{FORM["unk_policy"]["label"]}" (in Sampling)'
)


def form_json() -> str:
    """`FORM` as the text of `demo/web/form.json`."""
    return json.dumps(FORM, indent=2, ensure_ascii=False) + "\n"
