"""gpt-serve generate: streams text, bad input exits 2 with a message naming it, the model's own prompt by default."""

import re
from pathlib import Path

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
        (["--temperature", "-1"], r"temperature must be a number in \[0, 2\] \(0 = greedy\), got -1"),
        (["--top-p", "2"], r"top_p must be a number in \(0, 1\], got 2"),
        (["--prompt", "héllo"], r"1 character outside this model's vocabulary: 'é' \(position 1\)"),
        (["--window-mode", "refill", "--refill-tokens", "0"], "refill_tokens must be an integer"),
        (["--window-mode", "exact", "--refill-tokens", "5"], "refill_tokens applies only with window_mode 'refill'"),
        (["--max-new-tokens", "-5"], r"max_new_tokens must be an integer in \[1, 100000\], got -5"),
        (["--backend", "cuda"], "backend must be one of 'torch' "),
        (["--stop", ""], "stop must be a string or a list of at most 4 non-empty strings"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(tiny_model_dir, capsys, args, message):
    assert main(["generate", str(tiny_model_dir), "--prompt", "ROMEO:", *args]) == 2
    captured = capsys.readouterr()
    assert re.search(message, captured.err)
    assert captured.out == ""  # checked before the prompt is echoed: no partial output ahead of the error


@pytest.mark.parametrize("backend", ["torch", "onnx"])
@pytest.mark.parametrize("threads", ["0", "-3", "10000"])
def test_bad_thread_counts_are_usage_errors(capsys, backend, threads):
    """More threads than CPUs only make every operator wait (10000 once turned a 4 s run into 71 s)."""
    from gpt_serve.generation.backends.threads import available_cpus

    with pytest.raises(SystemExit) as exc:
        main(["generate", "ladder-a", "--backend", backend, "--threads", threads])
    message = f"--threads: must be an integer in [1, {available_cpus()}] (the CPUs this process may use), got {threads}"
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_load_backend_checks_threads():
    from gpt_serve.cli.generate import load_backend

    with pytest.raises(ValueError, match="threads must be None .* or an integer in \\[1, \\d+\\] .*, got 0"):
        load_backend("ladder-a", "torch", threads=0)


def test_unknown_model_is_named(capsys):
    assert main(["generate", "no-such-model"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_a_folder_that_is_not_a_model_is_named(tmp_path, capsys):
    assert main(["generate", str(tmp_path)]) == 2
    assert f"{tmp_path} is a folder but not a model folder: it has no config.json" in capsys.readouterr().err


def test_a_corrupt_config_is_an_error_not_a_traceback(tmp_path, tiny_model_dir, capsys):
    import shutil

    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    (folder / "config.json").write_text("{not json", encoding="utf-8")
    assert main(["generate", str(folder), "--max-new-tokens", "3"]) == 2
    assert "config.json" in capsys.readouterr().err


def test_loading_prints_no_progress_bar(tmp_path):
    import subprocess
    import sys

    from gpt_serve.folders.corpus_record import read_corpus_record
    from gpt_serve.models import model_path

    cmd = [sys.executable, "-m", "gpt_serve", "generate", "ladder-a", "--max-new-tokens", "3", "--threads", "1"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    prompt = read_corpus_record(model_path("ladder-a")).default_prompt  # generate's default: the model's own prompt
    assert "Loading weights" not in result.stderr and result.stdout.startswith(prompt)
    assert len(result.stdout) == len(prompt) + 3 + 1


def test_generate_starts_from_the_models_own_prompt_and_names_its_flag_for_unknown_characters(
    tiny_model_dir, tmp_path, capsys
):
    import shutil

    from gpt_serve.folders.corpus_record import CorpusRecord, write_corpus_record

    folder = shutil.copytree(tiny_model_dir, tmp_path / "model")
    write_corpus_record(folder, CorpusRecord("t", "d", ("KING:\nHark",)))
    assert main(["generate", str(folder), "--max-new-tokens", "3", "--seed", "0"]) == 0
    assert capsys.readouterr().out.startswith("KING:\nHark")  # the default prompt: the model's first sample
    assert main(["generate", str(folder), "--prompt", "é", "--max-new-tokens", "3"]) == 2
    assert "pass --unk-policy replace (each becomes a space) or --unk-policy drop" in capsys.readouterr().err


def test_generate_with_a_broken_corpus_json_warns_and_generates_as_the_demo_serves(tiny_model_dir, tmp_path, caplog):
    import logging
    import shutil

    folder = shutil.copytree(tiny_model_dir, tmp_path / "model")
    (folder / "corpus.json").write_text("[" * 5000, encoding="utf-8")  # json's RecursionError, once a traceback
    with caplog.at_level(logging.WARNING, logger="gpt_serve.folders.corpus_record"):
        assert main(["generate", str(folder), "--max-new-tokens", "3", "--seed", "0"]) == 0  # from a newline
    assert "corpus.json: its JSON is nested too deep" in caplog.text and "is ignored" in caplog.text


def test_the_folders_generation_config_is_the_default(tiny_model_dir, tmp_path, capsys):
    import json
    import shutil

    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "tiny"))
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "max_new_tokens": 9, "do_sample": False}))
    assert main(["generate", str(folder), "--prompt", "ROMEO:", "--no-echo"]) == 0
    greedy = capsys.readouterr().out
    assert len(greedy) == 9 + 1  # the folder's length, and its greedy search: the same text for any seed
    assert main(["generate", str(folder), "--prompt", "ROMEO:", "--no-echo", "--seed", "5"]) == 0
    assert capsys.readouterr().out == greedy
    assert main(["generate", str(folder), "--prompt", "ROMEO:", "--no-echo", "--max-new-tokens", "4"]) == 0
    assert capsys.readouterr().out == greedy[:4] + "\n"  # a flag wins
    assert main(["generate", str(folder), "--prompt", "R", "--no-echo", "--generation-config", "vllm"]) == 0
    assert len(capsys.readouterr().out) == 256 + 1  # the built-in defaults
    path.write_text(json.dumps({**json.loads(path.read_text()), "top_p": 3}))
    assert main(["generate", str(folder), "--prompt", "ROMEO:"]) == 2
    captured = capsys.readouterr()
    assert f"{path}: top_p must be a number in (0, 1], got 3" in captured.err and captured.out == ""


def test_the_model_is_positional_or_given_with_model(tiny_model_dir, capsys):
    """`gpt-serve generate MODEL` and `--model MODEL` (vLLM's and transformers' spelling) are one argument."""
    args = ["--prompt", "ROMEO:", "--max-new-tokens", "8", "--seed", "1"]
    assert main(["generate", str(tiny_model_dir), *args]) == 0
    positional = capsys.readouterr().out
    assert main(["generate", "--model", str(tiny_model_dir), *args]) == 0
    assert capsys.readouterr().out == positional
    assert main(["generate", "ladder-a", "--model", str(tiny_model_dir), *args]) == 2
    assert f"two models given: MODEL 'ladder-a' and --model '{tiny_model_dir}'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("runs/my-modle", "the model folder 'runs/my-modle' does not exist"),
        ("shakespear", "unknown model 'shakespear'"),
    ],
)
def test_a_mistyped_folder_is_missing_a_mistyped_name_unknown(capsys, model, message):
    assert main(["generate", model, "--max-new-tokens", "3"]) == 2
    assert message in capsys.readouterr().err


def test_generate_takes_a_grammar_file(tiny_model_dir, tmp_path, capsys):
    grammar = tmp_path / "answer.lark"
    grammar.write_text('start: ("Ay" | "No") ", my lord" /[.!]/\n')
    assert (
        main(["generate", str(tiny_model_dir), "--prompt", "Wilt thou? ", "--no-echo", "--grammar", str(grammar)]) == 0
    )
    assert re.fullmatch(r"(Ay|No), my lord[.!]\n", capsys.readouterr().out)
    grammar.write_text("start: foo\n")
    assert main(["generate", str(tiny_model_dir), "--prompt", "Wilt thou? ", "--grammar", str(grammar)]) == 2
    captured = capsys.readouterr()
    assert 'structured_outputs.grammar: the grammar is malformed or unsupported: at 1(8): unknown name: "foo"' in (
        captured.err
    )


def test_generate_takes_a_regex_choices_and_a_schema_file(tiny_model_dir, tmp_path, capsys):
    base = ["generate", str(tiny_model_dir), "--prompt", "ROMEO:", "--no-echo", "--seed", "1"]
    assert main([*base, "--regex", "[A-Z]{2,6}:\n[a-z ]{1,9}[.!]"]) == 0
    assert re.fullmatch(r"[A-Z]{2,6}:\n[a-z ]{1,9}[.!]\n", capsys.readouterr().out)
    assert main([*base, "--choice", "Ay.", "--choice", "No, my lord."]) == 0
    assert capsys.readouterr().out in ("Ay.\n", "No, my lord.\n")
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object", "properties": {"age": {"type": "integer"}}}')
    assert main([*base, "--json-schema", str(schema)]) == 2  # Tiny Shakespeare's vocabulary has no '{'
    captured = capsys.readouterr()
    assert "vocabulary cannot write any text the constraint accepts: it lacks the characters '\"'" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize(
    "args, message",
    [
        (["--regex", "a("], r"structured_outputs.regex: the regex is malformed or unsupported \(missing \)"),
        (["--json-schema", "/nonexistent/schema.json"], "--json-schema: cannot read /nonexistent/schema.json"),
        (["--grammar", "/nonexistent/answer.lark"], "--grammar: cannot read /nonexistent/answer.lark"),
    ],
)
def test_bad_constraints_exit_2_with_a_message(tiny_model_dir, capsys, args, message):
    assert main(["generate", str(tiny_model_dir), "--prompt", "ROMEO:", *args]) == 2
    captured = capsys.readouterr()
    assert re.search(message, captured.err) and captured.out == ""


def test_two_constraints_are_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--regex", "a", "--choice", "b"])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
