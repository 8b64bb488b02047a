"""`python -m demo` refuses bad flags before it loads anything."""

import pytest

from demo.cli import build_parser


@pytest.mark.parametrize(
    "args, message",
    [
        (["--threads", "0"], "--threads: must be an integer in [1, "),
        (["--max-num-seqs", "-2"], "--max-num-seqs/--concurrency: must be an integer >= 1, got -2"),
        (["--concurrency", "-2"], "--max-num-seqs/--concurrency: must be an integer >= 1, got -2"),
        (["--max-tokens-limit", "0"], "--max-tokens-limit/--max-new-tokens-limit: must be an integer >= 1, got 0"),
        (["--max-new-tokens-limit", "0"], "--max-tokens-limit/--max-new-tokens-limit: must be an integer >= 1, got 0"),
        (["--log-level", "loud"], "--log-level: invalid choice: 'LOUD'"),
        (["--port", "70000"], "--port: must be a TCP port in [1, 65535], got 70000"),
        (["--port", "-1"], "--port: must be a TCP port in [1, 65535], got -1"),
        (["--max-body-bytes", "0"], "--max-body-bytes: must be an integer >= 1, got 0"),
        (["--shutdown-timeout", "0"], "--shutdown-timeout: must be a number > 0, got 0"),
        (["--backend", "tensorflow"], "--backend: invalid choice: 'tensorflow'"),
        (["--stream-interval", "-1"], "--stream-interval: must be a finite number >= 0, got -1"),
        (["--stream-interval", "nan"], "--stream-interval: must be a finite number >= 0, got nan"),
        (["--max-updates-per-second", "inf"], "--max-updates-per-second: must be a finite number >= 0, got inf"),
        (["--max-updates-per-second", "lots"], "--max-updates-per-second: invalid non_negative_float value"),
    ],
)
def test_bad_flags_are_usage_errors(capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(args)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_busy_port_is_named_before_any_model_loads(capsys):
    import time

    from demo.cli import main
    from tests.conftest import busy_port

    with busy_port() as port:
        start = time.perf_counter()
        assert main(["--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot serve on 127.0.0.1:{port}" in err and f'make demo DEMO_ARGS="--port {port + 1}"' in err
    assert time.perf_counter() - start < 5  # nothing was loaded


@pytest.mark.parametrize(
    ("flags", "env", "address"),
    [
        ([], {}, ("127.0.0.1", 7860)),
        ([], {"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "7861"}, ("0.0.0.0", 7861)),
        (["--host", "127.0.0.2", "--port", "8080"], {"GRADIO_SERVER_NAME": "0.0.0.0", "GRADIO_SERVER_PORT": "7861"},
         ("127.0.0.2", 8080)),
    ],
)  # fmt: skip
def test_the_demo_listens_where_gradios_variables_say_unless_the_flags_do(monkeypatch, flags, env, address):
    """Hugging Face Spaces set GRADIO_SERVER_NAME / GRADIO_SERVER_PORT; --host / --port win when given."""
    from demo.cli import bind_address

    for name in ("GRADIO_SERVER_NAME", "GRADIO_SERVER_PORT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(flags)
    assert bind_address(args.host, args.port) == address


def test_a_bad_gradio_port_variable_is_named(monkeypatch, capsys):
    from demo.cli import main

    monkeypatch.setenv("GRADIO_SERVER_PORT", "http")
    assert main([]) == 2
    assert "$GRADIO_SERVER_PORT must be a TCP port in [1, 65535], got 'http'" in capsys.readouterr().err


def test_the_demo_takes_its_models_as_gpt_serve_serve_does(models_root):
    from demo.cli import demo_registry

    named = demo_registry(build_parser().parse_args(["ladder-b", str(models_root / "tiny"), "--threads", "1"]))
    assert named.names == ["ladder-b", "tiny"] and named.default_model() == "ladder-b"
    shipped = demo_registry(build_parser().parse_args(["--models-root", str(models_root), "--threads", "1"]))
    assert "ladder-e" in shipped.names and "ladder-e" not in shipped.available  # the ladder listed when missing


def test_the_demo_keeps_prompts_as_gpt_serve_serve_does(models_root, capsys):
    from demo.cli import demo_registry

    args = ["--models-root", str(models_root), "--threads", "1"]
    assert demo_registry(build_parser().parse_args(args)).prompt_cache_bytes == 64 * 2**20
    assert demo_registry(build_parser().parse_args([*args, "--prompt-cache-mb", "0"])).prompt_cache_bytes == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args([*args, "--prompt-cache-mb", "-1"])
    assert "argument --prompt-cache-mb: must be an integer >= 0, got -1" in capsys.readouterr().err


def test_the_flags_of_gpt_serve_serve_and_the_older_spellings_name_the_same_knobs():
    parse = build_parser().parse_args
    new = parse(["--max-num-seqs", "3", "--max-tokens-limit", "500", "--log-level", "debug"])
    old = parse(["--concurrency", "3", "--max-new-tokens-limit", "500", "--log-level", "DEBUG"])
    assert (new.concurrency, new.max_tokens_limit, new.log_level) == (old.concurrency, old.max_tokens_limit, "DEBUG")
    assert (new.concurrency, new.max_tokens_limit) == (3, 500)
    args = parse(["ladder-a", "--model", "ladder-b"])  # --model: the default model, as serve and generate take it
    assert (args.models, args.model_flag) == (["ladder-a"], "ladder-b")


def test_model_chooses_the_page_s_model_among_those_found_or_adds_a_folder(models_root, tiny_model_dir):
    from demo.cli import default_model_name, demo_registry

    def opens_with(*argv):
        args = build_parser().parse_args(["--models-root", str(models_root), *argv])
        registry = demo_registry(args)
        return registry.default_model(default_model_name(args, registry)), registry.names

    model, names = opens_with("--model", "ladder-a")  # all the models found, ladder-a selected
    assert model == "ladder-a" and {"tiny", "ladder-b"} <= set(names)
    model, names = opens_with("--model", str(tiny_model_dir))  # a folder: served beside them, selected
    assert model == tiny_model_dir.name and {tiny_model_dir.name, "tiny", "ladder-a"} <= set(names)
    model, names = opens_with("ladder-a", "--model", "ladder-b")  # as `gpt-serve serve`: the default model, first
    assert model == "ladder-b" and "ladder-a" in names
