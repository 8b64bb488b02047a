"""Grammars (`structured_outputs.grammar`, Lark or EBNF) and `json_object` through llguidance (`grammar`): what they
let a model write, how a row ends, and what is refused, on the shipped model and on a tiny model whose vocabulary
writes JSON."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from lark import Lark

from gpt_serve.generation import EngineError, RequestError, parse_request
from gpt_serve.generation.constraints import compile_constraint
from gpt_serve.generation.grammar import GrammarAutomaton
from gpt_serve.generation.structured import check_response_format, check_structured_outputs
from tests.generation.test_constraints import texts

SPEAKER = 'start: NAME ":\\n" LINE\nNAME: /[A-Z]+/\nLINE: /[A-Z][a-z ,]{3,40}[.!?]/\n'
# JSON objects of scalars and arrays of them, keys and strings short: a random model closes them within max_tokens
SMALL_JSON = r"""
start: object
object: "{" [pair ("," pair)*] "}"
pair: STRING ":" value
value: STRING | NUMBER | array | "true" | "false" | "null"
array: "[" [scalar ("," scalar)*] "]"
scalar: STRING | NUMBER
STRING: /"[a-z]{0,6}"/
NUMBER: /-?[1-9][0-9]{0,3}/
"""


def grammar(text: str, loaded, end: str = ""):
    return compile_constraint(check_structured_outputs({"grammar": text}).ending(end), loaded.vocab.chars)


def ids(loaded, text: str) -> list[int]:
    return [loaded.vocab.stoi[c] for c in text]


# -- the automaton --


def test_a_grammar_compiles_to_a_matcher_per_row_masked_over_the_vocabulary_only(shakespeare):
    a = grammar('start: "ab" | "ac"', shakespeare)
    assert isinstance(a, GrammarAutomaton) and grammar('start: "ab" | "ac"', shakespeare) is a  # cached
    v = shakespeare.vocab.stoi
    first, other = a.walk([]), a.walk([])
    masks = a.masks([first])
    assert masks.shape == (1, len(v))  # no column for the virtual EOS (nor the byte tokens past it)
    assert masks[0].nonzero()[0].tolist() == [v["a"]]
    a.advance(first, v["a"])
    assert sorted(a.masks([first])[0].nonzero()[0].tolist()) == sorted([v["b"], v["c"]])
    assert a.masks([other])[0].nonzero()[0].tolist() == [v["a"]]  # each walk from the start is a state of its own
    assert a.is_final(a.walk(ids(shakespeare, "ac"))) and not a.is_final(first)
    with pytest.raises(ValueError, match="token 1 .* is not allowed by the grammar"):
        a.walk(ids(shakespeare, "aa"))


def test_a_grammar_that_can_go_on_is_not_final_where_it_accepts(shakespeare):
    a = grammar('start: /[a-z]+/ "."?', shakespeare)
    state = a.walk(ids(shakespeare, "ab"))
    assert state.matcher.is_accepting() and not a.is_final(state)
    assert a.is_final(a.walk(ids(shakespeare, "."), state))


def test_the_end_of_speech_may_follow_the_grammars_text(shakespeare):
    """For chat the constraint is followed by an optional end of speech (`Constraint.end`)."""
    a = grammar('start: "Ay" | "No"', shakespeare, end="\n\n")
    ay = a.walk(ids(shakespeare, "Ay"))
    assert not a.is_final(ay) and a.masks([ay])[0].nonzero()[0].tolist() == [shakespeare.vocab.stoi["\n"]]
    assert a.is_final(a.walk(ids(shakespeare, "\n\n"), ay))


def test_allowed_token_ids_narrow_a_grammar(shakespeare):
    v = shakespeare.vocab.stoi
    a = compile_constraint(check_structured_outputs({"grammar": "start: /[a-c]+/"}), shakespeare.vocab.chars, [v["b"]])
    assert a.masks([a.walk([])])[0].nonzero()[0].tolist() == [v["b"]]


def test_the_state_of_a_row_is_rebuilt_from_its_tokens(shakespeare):
    """What a row made again from its tokens (a preempted row) finds: a state with the same mask."""
    from gpt_serve.generation.requests import Request, Stream
    from gpt_serve.generation.rows import Row

    a = grammar('start: "ab" /[a-z]+/ "."', shakespeare)
    v = shakespeare.vocab.stoi
    row = Row(Stream(Request([v["R"]], 8, constraint=a), None), 16, len(v))
    for c in "abc":
        assert not row.accept(v[c])
    again = Row(Stream(Request(row.ids, 8, constraint=a), None), 16, len(v))
    again.prompt_len = row.prompt_len
    again.state = a.walk(again.ids[again.prompt_len :])
    np.testing.assert_array_equal(a.masks([row.state]), a.masks([again.state]))
    assert row.accept(v["."])  # accepted with nothing to follow: the row is complete


# -- generation on the shipped model --


def test_sampled_speaker_lines_all_parse_and_stop(shakespeare):
    fields = {"prompt": "ROMEO:\nI love thee.\n\n", "max_tokens": 120, "temperature": 1, "seed": 5}
    streams = texts(shakespeare, {**fields, "structured_outputs": {"grammar": SPEAKER}}, n=8, max_batch=8)
    parser = Lark(SPEAKER)
    for s in streams:
        parser.parse(s.text)  # raises for a text the grammar does not accept
        assert s.finish_reason == "stop", s.text
    assert len({s.text for s in streams}) > 1


def test_an_ebnf_grammar_is_taken_as_vllm_takes_it(shakespeare):
    choices = ("Ay, my lord.", "No, my lord.", "Ay!", "No!")
    gbnf = 'root ::= ("Ay" | "No") (", my lord." | "!")'
    streams = texts(shakespeare, {"prompt": "Wilt thou?\n", "seed": 3, "structured_outputs": {"grammar": gbnf}}, n=8,
                    max_batch=8)  # fmt: skip
    assert all(s.text in choices and s.finish_reason == "stop" for s in streams)


def test_a_grammar_row_alone_and_in_a_batch_gets_the_same_text(shakespeare):
    fields = {"prompt": "ROMEO:\n", "max_tokens": 60, "temperature": 1, "structured_outputs": {"grammar": SPEAKER}}
    alone = [texts(shakespeare, {**fields, "seed": 9 + i})[0].text for i in (0, 5)]
    batch = texts(shakespeare, {**fields, "seed": 9}, n=8, max_batch=8)
    assert [batch[0].text, batch[5].text] == alone


def test_a_grammar_that_goes_on_with_a_character_the_vocabulary_lacks_ends_with_an_error(shakespeare):
    """`{` is not in the vocabulary: the row can write `a`, then nothing; it ends naming what it lacks."""
    with pytest.raises(EngineError, match=r"structured_outputs.grammar: the grammar goes on after 1 character only "
                                          r"with characters this model's vocabulary cannot write: '\{'"):  # fmt: skip
        texts(shakespeare, {"prompt": "ROMEO:", "max_tokens": 10, "structured_outputs": {"grammar": 'start: "a" "{"'}})


def test_a_grammar_past_llguidances_limits_ends_its_row_with_an_error_at_once(shakespeare):
    """A lexer that would grow without bound: the step's fuel runs out, the row ends naming it, nothing stalls."""
    hostile = {"grammar": "start: /((a{100}){100}){100}/"}
    with pytest.raises(EngineError, match="structured_outputs.grammar: the grammar's parser failed: lexer error"):
        texts(shakespeare, {"prompt": "ROMEO:", "max_tokens": 40, "structured_outputs": hostile})
    (s,) = texts(shakespeare, {"prompt": "ROMEO:", "max_tokens": 5, "structured_outputs": {"grammar": SPEAKER}})
    assert s.text  # the next request is served


# -- refusals --


@pytest.mark.parametrize(
    "text, message",
    [
        ("start: foo", 'the grammar is malformed or unsupported: at 1(8): unknown name: "foo"'),
        ('start: "a" (', "the grammar is malformed or unsupported: 1(13): Expected token ')'"),
        ('root ::= "a', "the grammar is malformed: Failed to convert the grammar from GBNF to Lark"),
        (
            'start: "{" /[a-z]+/ "}"',
            "this model's vocabulary cannot write the first character of any text the "
            "grammar accepts: it lacks the characters '{'",
        ),  # fmt: skip
    ],
)
def test_bad_grammars_are_refused_naming_the_problem(shakespeare, text, message):
    with pytest.raises(RequestError, match=re.escape(f"structured_outputs.grammar: {message}")) as e:
        grammar(text, shakespeare)
    assert e.value.field == "structured_outputs"


def test_a_grammar_too_long_is_refused_before_compiling(shakespeare):
    with pytest.raises(RequestError, match="structured_outputs.grammar must be a non-empty string of at most 10,000"):
        parse_request({"prompt": "a", "structured_outputs": {"grammar": "start: " + '"a" ' * 3000}})


# -- a vocabulary that writes JSON --


def test_a_small_json_grammar_gives_json_every_time(json_model):
    fields = {
        "prompt": "{",
        "max_tokens": 300,
        "seed": 0,
        "temperature": 1,
        "structured_outputs": {"grammar": SMALL_JSON},
    }
    streams = texts(json_model, fields, n=8, max_batch=8)
    for s in streams:
        assert isinstance(json.loads(s.text), dict), s.text
        assert s.finish_reason == "stop"


def test_json_object_means_any_json_object_nested(json_model):
    a = compile_constraint(check_response_format({"type": "json_object"}), json_model.vocab.chars)
    assert isinstance(a, GrammarAutomaton)
    for text in ['{"a": {"b": [1, {"c": [null, true, "x"]}]}, "d": -2.5e3}', "{}", '{"a":[[[[]]]]}']:
        json.loads(text)
        assert a.is_final(a.walk(ids(json_model, text))), text
    with pytest.raises(ValueError):
        a.walk(ids(json_model, "[1]"))  # an array is no object
