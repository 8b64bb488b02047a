"""The chat format: the folder's Jinja template (rendered by transformers' own `apply_chat_template`) and the
server's renderer agree character for character over a table of conversations, refuse the same ones, and a folder's
record is checked (its speakers in the vocabulary, its template its format's)."""

import json

import pytest

from gpt_serve import CharTokenizer
from gpt_serve.chargpt.chat_format import (
    PLAIN,
    PLAY,
    ChatError,
    ChatFormat,
    chat_template,
    format_for_text,
    read_chat_format,
    render,
)
from gpt_serve.chargpt.chat_format import speakers as table
from gpt_serve.folders.corpus import TINY_SHAKESPEARE_CHARS

CHARS = list(TINY_SHAKESPEARE_CHARS)
USER = {"role": "user", "content": "Good morrow."}

CONVERSATIONS = {
    "one message": [USER],
    "a reply and another turn": [
        USER,
        {"role": "assistant", "content": "Ay me!"},
        {"role": "user", "content": "Speak"},
    ],
    "system prologue": [{"role": "system", "content": "A street in Verona."}, USER],
    "developer is system": [{"role": "developer", "content": "Night."}, USER],
    "names": [{"role": "user", "content": "Hal!", "name": "falstaff"}, {**USER, "name": "lady_capulet"}],
    "blank lines inside": [{"role": "user", "content": "One.\n\nTwo.\n \t\n\nThree.\n   "}],
    "carriage returns": [{"role": "user", "content": "a\r\n\r\nb"}],
    "unicode blank line": [{"role": "user", "content": "a\n\u2028\nb\n\u3000"}],
    "newlines at the ends": [{"role": "user", "content": "\n\n  Indented.\n\n"}],
    "empty content": [{"role": "user", "content": ""}, {"role": "assistant", "content": "\n\n"}],
    "content parts": [{"role": "user", "content": [{"type": "text", "text": "Ay "}, {"type": "text", "text": "me"}]}],
    "a quote in a name": [{**USER, "name": "O'Brien"}],
    "null name": [{**USER, "name": None}],
}
SPEAKERS = [
    None,
    {"user": "king henry", "assistant": "FALSTAFF"},
    {"system": "chorus"},
    {"system": None, "assistant": "Prince_Hal"},
]
FORMATS = [PLAY, PLAIN, ChatFormat("USER", "ASSISTANT", "NARRATOR")]


def template_render(fmt: ChatFormat, messages, speakers=None, add_generation_prompt=True) -> str:
    tokenizer = CharTokenizer(chars=CHARS, chat_format=fmt)
    extra = {} if speakers is None else {"speakers": speakers}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt, **extra)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.user)
@pytest.mark.parametrize("speakers", SPEAKERS, ids=str)
@pytest.mark.parametrize("name", list(CONVERSATIONS))
def test_the_template_renders_what_the_server_renders(fmt, speakers, name):
    messages = CONVERSATIONS[name]
    expected = render(messages, speakers, fmt)
    assert template_render(fmt, messages, speakers) == expected
    # without the generation prompt: the conversation alone, the assistant's heading not written
    heading = table(speakers, fmt)["assistant"] + ":\n"
    assert template_render(fmt, messages, speakers, add_generation_prompt=False) == expected.removesuffix(heading)


def test_the_play_format_reads_as_the_play():
    messages = [{"role": "system", "content": "Verona."}, USER, {"role": "assistant", "content": "Ay me!"}]
    assert render(messages) == "Verona.\n\nROMEO:\nGood morrow.\n\nJULIET:\nAy me!\n\nJULIET:\n"
    assert render([{**USER, "name": "bob"}], None, PLAIN) == "bob:\nGood morrow.\n\nAssistant:\n"


REFUSED = {
    "no messages": ([], None, "non-empty list"),
    "not a list": ("hi", None, "non-empty list"),
    "unknown role": ([{"role": "bot", "content": "x"}], None, "role must be one of"),
    "no role": ([{"content": "x"}], None, "role must be one of"),
    "content not text": ([{"role": "user", "content": 3}], None, "content must be text"),
    "no content": ([{"role": "user"}], None, "content must be text"),
    "image part": ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], None, "only text parts"),
    "long name": ([{**USER, "name": "x" * 70}], None, "a speaker's name is 1-64"),
    "name with a colon": ([{**USER, "name": "A:B"}], None, "a speaker's name is"),
    "name not text": ([{**USER, "name": 7}], None, "a speaker's name is"),
    "name from a digit": ([{**USER, "name": "2nd"}], None, "a speaker's name is"),
    "unknown speaker role": ([USER], {"narrator": "X"}, "speakers must map roles"),
    "speakers not a mapping": ([USER], ["ROMEO"], "speakers must map roles"),
    "bad speaker": ([USER], {"user": "A\nB"}, "a speaker's name is"),
    "no user speaker": ([USER], {"user": None}, "a speaker's name is"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_both_refuse_the_same_conversations(name):
    from jinja2 import TemplateError

    messages, speakers, message = REFUSED[name]
    with pytest.raises(ChatError, match=message):
        render(messages, speakers)
    # transformers refuses these two before the template runs
    message = {"no messages": "empty conversation", "not a list": "should be dicts"}.get(name, message)
    with pytest.raises((TemplateError, ValueError, TypeError), match=message):
        template_render(PLAY, messages, speakers)


def test_a_format_must_be_writable_in_the_vocabulary():
    with pytest.raises(ValueError, match=r"characters the vocabulary lacks \(':EIJLMORTU'\)"):
        CharTokenizer(chars=list("abc\n"), chat_format=PLAY)
    assert CharTokenizer(chars=list("abc\n")).chat_template is None  # "auto": no chat where the play cannot be written
    assert CharTokenizer(chars=CHARS).chat_format == PLAY.record()
    assert CharTokenizer(chars=CHARS, chat_format=None).chat_template is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("ROMEO:\nHi.\n\nJULIET:\nHo.\n\nFirst Citizen:\nPeace!\n", PLAY),
        ("ROMEO:\nHi.\n\nJULIET:\nHo. Users and Assistants.\n", PLAIN),  # two speakers are not yet a play
        ("Call me Ishmael. Users and Assistants.", PLAIN),
        ("USER ASSISTANT", ChatFormat("USER", "ASSISTANT")),
        ("def f(user, assistant):\n    return user\n", ChatFormat("user", "assistant", None, False)),
        ("abc", None),
    ],
)
def test_a_text_gets_the_format_that_fits_it(text, expected):
    text = text + ":\n" if expected is not None else text
    assert format_for_text(text) == expected
    assert CharTokenizer.from_corpus(text).chat_format == (None if expected is None else expected.record())


def test_save_pretrained_writes_the_template_as_transformers_does(tmp_path):
    CharTokenizer.from_corpus("Users and Assistants:\nhi\n").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["chat_format"] == PLAIN.record() and "chat_template" not in config
    assert (tmp_path / "chat_template.jinja").read_text() == chat_template(PLAIN)
    again = CharTokenizer.from_pretrained(tmp_path)
    assert again.chat_format == PLAIN.record() and again.chat_template == chat_template(PLAIN)
    assert read_chat_format(tmp_path, again.vocab.chars) == PLAIN


def test_a_folder_whose_template_is_not_its_format_is_refused(tmp_path):
    CharTokenizer(chars=CHARS).save_pretrained(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0].content }}")
    with pytest.raises(ValueError, match="chat_template.jinja is not the template of"):
        read_chat_format(tmp_path, CHARS)
    with pytest.raises(ValueError, match="chat_template.jinja.* is not the template of chat_format"):
        CharTokenizer.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "record, message",
    [
        ({"user": "ROMEO", "assistant": "JULIET", "narrator": "X"}, "must map"),
        ({"user": "RO:MEO"}, r"chat_format\.user: a speaker's name"),
        ({"system": 3}, r"chat_format\.system: a speaker's name"),
        ({"upper_names": "yes"}, "upper_names must be true or false"),
        ("ROMEO", "must map"),
        ({"user": "Zed"}, "lacks: 'Z'"),
    ],
)
def test_a_bad_record_is_named(tmp_path, record, message):
    chars = [c for c in CHARS if c != "Z"]
    CharTokenizer(chars=chars).save_pretrained(tmp_path)
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "chat_format": record}))
    (tmp_path / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match=message) as error:
        read_chat_format(tmp_path, chars)
    assert "tokenizer_config.json" in str(error.value)


def test_a_folder_that_records_none(tmp_path):
    assert read_chat_format(tmp_path, CHARS) == PLAY  # no tokenizer_config.json: a folder from before formats
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_format": None}))
    assert read_chat_format(tmp_path, CHARS) is None
    (tmp_path / "tokenizer_config.json").write_text("[1]")
    with pytest.raises(ValueError, match="must hold a JSON object"):
        read_chat_format(tmp_path, CHARS)


def test_the_shipped_folders_hold_the_plays_template():
    from gpt_serve.models import MODELS_DIR, discover

    for folder in discover(MODELS_DIR).values():
        assert (folder / "chat_template.jinja").read_text() == chat_template(PLAY), folder
        assert read_chat_format(folder, CHARS) == PLAY
