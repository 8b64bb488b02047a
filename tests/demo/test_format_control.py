"""The page's Format control (`demo.format_control`) through the page's event functions, without a browser: the text
fits the regex or is one of the choices, it is the text /generate gives for the same `structured_outputs` and seed,
and a bad format is one line in the status, after which the page serves the next run."""

from __future__ import annotations

import re

import pytest

from demo.format_control import page_message, structured_outputs
from gpt_serve.generation.fields import RequestError
from tests.demo.conftest import form

CHOICES = ["Ay.", "No, my lord.", "Nay"]
SHORT_LINE = r"[A-Z][a-z]{2,6}[.!?]"  # ends within a few characters, whatever the tiny random model prefers


def run(handlers, **changes) -> tuple[str, str, str]:
    """The last (output, stats, status) of the page's Generate."""
    return list(handlers.ui_generate(None, None, *form(**changes)))[-1]


def generated(handlers, **changes) -> str:
    output, _, status = run(handlers, **changes)
    assert status == "Done.", status
    assert output.startswith("ROMEO:")
    return output[len("ROMEO:") :]


@pytest.mark.parametrize("seed", range(4))
def test_choices_give_one_of_them(handlers, seed):
    text = generated(handlers, format="choice", format_text="\n".join(CHOICES), seed=seed, max_new_tokens=30)
    assert text in CHOICES


@pytest.mark.parametrize("seed", range(4))
def test_a_regex_gives_a_match_and_ends_there(handlers, seed):
    text = generated(handlers, format="regex", format_text=SHORT_LINE, seed=seed, max_new_tokens=30)
    assert re.fullmatch(SHORT_LINE, text), text  # ended as soon as nothing may follow, long before 30 tokens


def test_free_text_ignores_the_box(handlers):
    """A regex typed, then Free text chosen again: the box is kept in the page but not sent."""
    assert generated(handlers, format="text", format_text="[A-Z") == generated(handlers)
    assert len(generated(handlers, format="text", format_text="[A-Z")) == 40


@pytest.mark.parametrize(
    ("kind", "box", "field"),
    [
        ("regex", r"[A-Z][a-z ]+[.!]", {"regex": r"[A-Z][a-z ]+[.!]"}),
        ("choice", "Ay.\r\nNo!\n\n", {"choice": ["Ay.", "No!"]}),
    ],
)
def test_the_page_gives_the_text_generate_gives(handlers, kind, box, field):
    """The same seed and format through the page's control and through /generate's `structured_outputs`."""
    page = generated(handlers, format=kind, format_text=box, seed=11, temperature=0.9, max_new_tokens=25)
    api = list(
        handlers.generate("ROMEO:", 25, 0.9, seed=11, model="tiny", window_mode="exact", structured_outputs=field)
    )
    assert page == api[-1]


def test_the_boxs_lines_are_the_choices_as_typed():
    assert structured_outputs("choice", " Ay.\r\n\nNo, my lord. \n") == {"choice": [" Ay.", "No, my lord. "]}
    assert structured_outputs("regex", "a\nb") == {"regex": "a\nb"}  # a newline typed into the box is one
    assert structured_outputs("text", "[A-Z") is None and structured_outputs(None, None) is None


BAD_FORMATS = [
    (
        dict(format="regex", format_text="[A-Z"),
        "⚠️ Format (Regex): the regex is malformed or unsupported (unterminated character set at position 0)",
    ),
    (
        dict(format="regex", format_text="(?<=a)b"),
        "⚠️ Format (Regex): the regex is malformed or unsupported (Unsupported: lookbacks are not implemented)",
    ),
    (
        dict(format="choice", format_text="{ok}\n[no]"),
        "⚠️ Format (Choices): this model's vocabulary cannot write any text the constraint accepts: it lacks the "
        "characters '[' ']' '{' '}'",
    ),
    (
        dict(format="regex", format_text=""),
        '⚠️ Format (Regex): the box is empty: type a regular expression, or choose "Free text"',
    ),
    (
        dict(format="choice", format_text="\n\n"),
        '⚠️ Format (Choices): the box is empty: type the choices, one per line, or choose "Free text"',
    ),
    (dict(format="json", format_text="{}"), "⚠️ Format must be one of ['text', 'regex', 'choice'], got 'json'"),
    (dict(format="regex", format_text=3), "⚠️ Format (Regex): the box holds text, got 3"),
]


@pytest.mark.parametrize(("changes", "status"), BAD_FORMATS, ids=[str(c) for c, _ in BAD_FORMATS])
def test_a_bad_format_is_one_line_in_the_status_and_the_page_serves_on(handlers, changes, status):
    assert run(handlers, **changes) == ("", "", status)
    assert "\n" not in status
    assert len(generated(handlers, max_new_tokens=10)) == 10


def test_the_comparison_says_a_bad_format_in_the_controls_words(handlers):
    """An empty box is refused before any column starts; a malformed regex by each column that runs (each compiles
    it for its model's vocabulary), in the same words."""
    *columns, status = list(handlers.ui_compare(None, None, *form(format="regex", format_text="")))[-1]
    assert status == BAD_FORMATS[3][1] and columns == [""] * len(handlers.compared)
    *texts, (*_, status) = list(handlers.ui_compare(None, None, *form(format="regex", format_text="[A-Z")))
    columns = texts[-1][:-1]  # the columns' last texts (the final update changes only the status)
    said = f"[{BAD_FORMATS[0][1].removeprefix('⚠️ ')}]"
    ran = [
        text for name, text in zip(handlers.compared, columns, strict=True) if name in ("tiny", "ladder-a", "ladder-b")
    ]
    assert ran == [said] * 3 and "ran in 0 of 6 columns" in status, (columns, status)


def test_other_refusals_keep_their_words():
    assert page_message(RequestError("temperature must be a number in [0, 2]", "temperature")) == (
        "temperature must be a number in [0, 2]"
    )
    json_refusal = RequestError("structured_outputs.json: ...", "structured_outputs")  # no control for it: as it is
    assert page_message(json_refusal) == "structured_outputs.json: ..."
