"""The gpt-serve command: generate streams text, bad input exits 2 with a message naming it."""

import re

import pytest

from gpt_serve.cli import main


def test_generate_streams_the_continuation(tiny_model_dir, capsys):
    assert main(["generate", str(tiny_model_dir), "--prompt", "ROMEO:", "--max-new-tokens", "25", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ROMEO:") and len(out) == len("ROMEO:") + 25 + 1  # + the final newline
    assert main(["generate", str(tiny_model_dir), "--prompt", "ROMEO:", "--max-new-tokens", "25", "--seed", "3"]) == 0
    assert capsys.readouterr().out == out


@pytest.mark.parametrize(
    "args, message",
    [
        (["--temperature", "-1"], "temperature must be a finite number >= 0"),
        (["--top-p", "2"], r"top_p must be in \(0, 1\]"),
        (["--prompt", "héllo"], "'é' at 1"),
        (["--window-mode", "refill", "--refill-tokens", "0"], "refill_tokens must be an integer"),
        (["--max-new-tokens", "-5"], "max_new_tokens must be in"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(tiny_model_dir, capsys, args, message):
    assert main(["generate", str(tiny_model_dir), "--prompt", "ROMEO:", *args]) == 2
    captured = capsys.readouterr()
    assert re.search(message, captured.err)
    assert captured.out == ""  # checked before the prompt is echoed: no partial output ahead of the error


def test_unknown_model_is_named(capsys):
    assert main(["generate", "no-such-model"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err
