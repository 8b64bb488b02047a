"""A model folder's generation_config.json as the defaults of a request that names none (vLLM's
`--generation-config auto`), a request's own values winning, bad values named by file and field."""

import json

import pytest

from gpt_serve.generation import parse_request
from gpt_serve.generation.folder_defaults import read_generation_defaults


def folder_with(tmp_path, **config):
    (tmp_path / "generation_config.json").write_text(json.dumps({"transformers_version": "5.24.0", **config}))
    return tmp_path


def test_the_folders_sampling_and_length_are_the_defaults(tmp_path):
    folder = folder_with(tmp_path, max_new_tokens=300, temperature=0.8, top_k=0, top_p=0.9, do_sample=True,
                         repetition_penalty=1.1, min_p=0.05, pad_token_id=65, use_cache=True)  # fmt: skip
    defaults = read_generation_defaults(folder)
    assert defaults == dict(max_new_tokens=300, temperature=0.8, top_k=0, top_p=0.9, repetition_penalty=1.1, min_p=0.05)
    assert read_generation_defaults(folder, "vllm") == {}  # vLLM's spelling: the built-in defaults
    request = parse_request({"prompt": "ROMEO:"}, defaults=defaults)
    assert (request.max_new_tokens, request.temperature, request.top_p, request.min_p) == (300, 0.8, 0.9, 0.05)
    builtin = parse_request({"prompt": "ROMEO:"})
    assert (builtin.max_new_tokens, builtin.temperature, builtin.top_p) == (256, 1.0, 1.0)


def test_a_requests_own_values_win_and_null_is_not_a_value(tmp_path):
    defaults = read_generation_defaults(folder_with(tmp_path, max_new_tokens=300, temperature=0.8))
    request = parse_request({"max_tokens": 5, "temperature": 0, "top_p": None}, defaults=defaults)
    assert (request.max_new_tokens, request.temperature, request.top_p) == (5, 0.0, 1.0)
    assert parse_request({"temperature": None}, defaults=defaults).temperature == 0.8
    # a server's lower limit lowers the folder's default, and still refuses a request over it
    assert parse_request({}, max_tokens_limit=100, defaults=defaults).max_new_tokens == 100
    with pytest.raises(ValueError, match="max_new_tokens must be an integer in"):
        parse_request({"max_tokens": 101}, max_tokens_limit=100, defaults=defaults)


def test_do_sample_false_is_greedy_and_a_folder_without_the_file_has_none(tmp_path):
    assert read_generation_defaults(folder_with(tmp_path, do_sample=False, temperature=0.7)) == {"temperature": 0.0}
    (tmp_path / "generation_config.json").unlink()
    assert read_generation_defaults(tmp_path) == {}


@pytest.mark.parametrize(
    "config, message",
    [
        (dict(temperature=5), r"temperature must be a number in \[0, 2\].*got 5"),
        (dict(top_p=0), r"top_p must be a number in \(0, 1\], got 0"),
        (dict(max_new_tokens="300"), r"max_new_tokens must be an integer in \[1, 100000\], got '300'"),
        (dict(max_new_tokens=0), r"max_new_tokens must be an integer"),
        (dict(top_k=-1), "top_k must be an integer"),
        (dict(repetition_penalty=0), "repetition_penalty must be a number"),
        (dict(do_sample="yes"), "do_sample must be true or false, got 'yes'"),
    ],
)
def test_a_bad_value_is_named_with_its_file(tmp_path, config, message):
    folder = folder_with(tmp_path, **config)
    with pytest.raises(ValueError, match=message) as error:
        read_generation_defaults(folder)
    assert str(error.value).startswith(f"{folder / 'generation_config.json'}: ")


def test_a_broken_file_and_a_bad_mode_are_named(tmp_path):
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot read .*generation_config.json"):
        read_generation_defaults(tmp_path)
    (tmp_path / "generation_config.json").write_text("[]")
    with pytest.raises(ValueError, match="must hold a JSON object, got a list"):
        read_generation_defaults(tmp_path)
    with pytest.raises(ValueError, match=r"generation_config must be one of \['auto', 'vllm'\]"):
        read_generation_defaults(tmp_path, "folder")


def test_new_and_shipped_folders_start_where_the_demo_starts():
    from demo.form import FORM
    from gpt_serve.models import MODELS_DIR, discover

    for folder in discover(MODELS_DIR).values():
        defaults = read_generation_defaults(folder)
        assert defaults["max_new_tokens"] == FORM["max_new_tokens"]["default"] == 300, folder
        assert defaults["temperature"] == FORM["temperature"]["default"] == 0.8, folder
