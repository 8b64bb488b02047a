"""The page's Format control: free text, a regex the text must match, or choices (one per line) the text is one
of, sent as the request's `structured_outputs` (docs/structured.md). /generate takes the field itself.

The control is a kind (`ui.format`) and a box (`ui.format_text`, shown once a kind other than free text is chosen);
`structured_outputs(kind, text)` turns them into the field, and `page_message` says a refusal in the control's words.
The in-browser page (`demo/web`) has no automaton: the note beside the control says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import SimpleNamespace

import gradio as gr

from gpt_serve.generation.fields import RequestError, show_value

FREE_TEXT = "text"  # as OpenAI's response_format {"type": "text"}: no constraint
KINDS = [("Free text", FREE_TEXT), ("Regex", "regex"), ("Choices", "choice")]  # (label, structured_outputs key)
BOXES = {  # kind -> (the box's label, its placeholder)
    "regex": ("Regex: the text must match it", "[A-Z][a-z]+:\\n[A-Z][a-z ,]+[.!?]"),
    "choice": ("Choices, one per line: the text is one of them", "Ay.\nNo, my lord."),
}
NAMES = {kind: label for label, kind in KINDS}
BROWSER_NOTE = (
    "Applied on the server. The [in-browser page](browser/) does not support a format: it always writes free text."
)
# The browser's side of the control (no server call): the box, labelled for the kind, and the note appear once a
# kind other than free text is chosen.
SHOW_JS = """(kind) => {
  const [boxes, note] = %s;
  const box = boxes[kind];
  return [
    {__type__: "update", visible: Boolean(box), label: box ? box[0] : "", placeholder: box ? box[1] : ""},
    box ? note : "",
  ];
}"""


def format_control(ui: SimpleNamespace) -> None:
    """Adds the control to the layout (`ui.format`, `ui.format_text`, `ui.format_note`) with its browser-side event."""
    ui.format = gr.Dropdown(KINDS, value=FREE_TEXT, label="Format", elem_id="format")
    ui.format_text = gr.Textbox(lines=2, max_lines=8, visible=False, elem_id="format-text")
    ui.format_note = gr.Markdown(elem_id="format-note")
    show = SHOW_JS % json.dumps([BOXES, BROWSER_NOTE])
    ui.format.change(None, ui.format, [ui.format_text, ui.format_note], js=show, queue=False, api_visibility="private")


def structured_outputs(kind, text) -> dict | None:
    """The request's `structured_outputs` for the control's kind and text: None for free text, `{"regex": text}`,
    or `{"choice": the lines of text}` (each line as typed, empty lines skipped). RequestError for an unknown kind or
    an empty box; the request specification checks the rest."""
    if kind is None or kind == FREE_TEXT:
        return None
    if kind not in BOXES:
        raise RequestError(
            f"Format must be one of {[k for _, k in KINDS]}, got {show_value(kind)}", "structured_outputs"
        )
    if not isinstance(text, str):
        raise RequestError(f"Format ({NAMES[kind]}): the box holds text, got {show_value(text)}", "structured_outputs")
    value = text if kind == "regex" else [line for line in text.replace("\r\n", "\n").split("\n") if line]
    if not value:
        what = "a regular expression" if kind == "regex" else "the choices, one per line"
        raise RequestError(
            f'Format ({NAMES[kind]}): the box is empty: type {what}, or choose "Free text"', "structured_outputs"
        )
    return {kind: value}


def page_message(error: RequestError) -> str:
    """A refusal as the page says it: the request field's name of a format (`structured_outputs.regex`) in the
    control's words (`Format (Regex)`); any other message as it is."""
    message = str(error)
    if error.field == "structured_outputs":
        for kind, label in ((k, NAMES[k]) for k in BOXES):
            message = message.replace(f"structured_outputs.{kind}", f"Format ({label})")
    return message


def in_page_words(stream: Iterator) -> Iterator:
    """`stream` (a comparison column's), its refusal said as the page says it (`page_message`)."""
    try:
        yield from stream
    except RequestError as e:
        raise RequestError(page_message(e), e.field) from None
