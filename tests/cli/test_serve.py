"""gpt-serve serve: a busy port named before anything loads, the default model preloaded unless told not to."""

import pytest

from gpt_serve.cli import main


def test_serve_names_a_busy_port_before_loading_anything(capsys):
    import time

    from tests.conftest import busy_port

    with busy_port() as port:
        start = time.perf_counter()
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot serve on 127.0.0.1:{port}" in err and "choose another with --port N" in err
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("preload", [True, False])
def test_serve_preloads_the_default_model_unless_told_not_to(models_root, monkeypatch, capsys, preload):
    """Before it answers, `gpt-serve serve` has the default model's decode loop running (`--no-preload`: none)."""
    import socket

    import gpt_serve.serving.api
    import gpt_serve.serving.launcher

    created = {}
    real_create_app = gpt_serve.serving.api.create_app

    def create_app(registry, **kwargs):
        created["schedulers"] = dict(registry.schedulers())
        created["registry"] = registry
        return real_create_app(registry, **kwargs)

    monkeypatch.setattr(gpt_serve.serving.api, "create_app", create_app)
    monkeypatch.setattr(gpt_serve.serving.launcher, "run_server", lambda *args: None)  # the server is not the point
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["serve", "--models-root", str(models_root), "--port", str(port), "--threads", "1"]
    try:  # without preloading, vLLM's `--generation-config vllm` too: the built-in defaults
        assert main(args + ([] if preload else ["--no-preload", "--generation-config", "vllm"])) == 0
    finally:
        created["registry"].close()
    assert created["registry"].generation_config == ("auto" if preload else "vllm")
    model = created["registry"].default_model()
    err = capsys.readouterr().err
    if preload:
        assert list(created["schedulers"]) == [(model, "torch")]
        assert f"gpt-serve serve: {model}/torch loaded and warmed up in " in err
    else:
        assert created["schedulers"] == {} and "warmed up" not in err


def test_vllm_spellings_are_aliases_of_ours():
    from gpt_serve.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["serve", "--max-num-seqs", "3"]).max_batch == parse(["serve", "--max-batch", "3"]).max_batch == 3
    origins = parse(["serve", "--allowed-origins", '["https://a.example", "http://127.0.0.1:8080"]',
                     "--allow-origin", "https://b.example"]).allow_origin  # fmt: skip
    assert origins == ["https://a.example", "http://127.0.0.1:8080", "https://b.example"]
    args = parse(["serve", "ladder-a", "runs/x", "--served-model-name", "a", "x"])
    assert (args.models, args.served_model_name) == (["ladder-a", "runs/x"], ["a", "x"])
    assert parse(["serve", "--log-level", "DEBUG"]).log_level == "debug"  # any case, as the demo takes it


def test_model_names_the_default_model_as_generate_and_the_demo_take_it():
    from gpt_serve.cli import build_parser
    from gpt_serve.cli.server_flags import models_named, served_model_names

    parse = build_parser().parse_args
    assert models_named(parse(["serve", "--model", "ladder-a"])) == ["ladder-a"]
    args = parse(["serve", "ladder-a", "ladder-b", "--model", "ladder-b", "--served-model-name", "a", "b"])
    assert (models_named(args), served_model_names(args)) == (["ladder-b", "ladder-a"], ["b", "a"])  # moved first
    args = parse(["serve", "ladder-a", "--model", "ladder-b"])
    assert (models_named(args), served_model_names(args)) == (["ladder-b", "ladder-a"], None)  # added first
    args = parse(["serve", "ladder-a", "--model", "ladder-b", "--served-model-name", "a"])
    with pytest.raises(ValueError, match="--model 'ladder-b' is not one of the MODELs that --served-model-name"):
        served_model_names(args)


def test_serve_model_serves_that_model_as_the_default(tiny_model_dir, monkeypatch, capsys):
    import gpt_serve.serving.launcher
    from tests.helpers import free_port

    monkeypatch.setattr(gpt_serve.serving.launcher, "run_server", lambda *args: None)
    argv = ["serve", "--model", str(tiny_model_dir), "--port", str(free_port()), "--threads", "1"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"{tiny_model_dir.name}/torch loaded and warmed up" in err
    assert f"models ['{tiny_model_dir.name}'] on http://127.0.0.1:" in err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("*", "'*' is not accepted: name each origin"),
        ('["*"]', "'*' is not accepted"),
        ("https://example.org/", "'https://example.org/' is not an origin: scheme://host[:port], no path"),
        ("example.org", "'example.org' is not an origin"),
        ('["https://a.example", 3]', "must be an origin or a JSON list of origins (strings)"),
        ('["https://a.example"', "not a JSON list of origins"),
    ],
)
def test_a_bad_origin_is_a_usage_error(capsys, value, message):
    from gpt_serve.cli import build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve", "--allowed-origins", value])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_serve_preloads_the_first_model_it_is_given(tiny_model_dir, monkeypatch, capsys):
    """`gpt-serve serve FOLDER`: that model alone, preloaded (never shakespeare)."""
    import gpt_serve.serving.launcher
    from tests.helpers import free_port

    monkeypatch.setattr(gpt_serve.serving.launcher, "run_server", lambda *args: None)
    assert main(["serve", str(tiny_model_dir), "--port", str(free_port()), "--threads", "1"]) == 0
    err = capsys.readouterr().err
    assert f"{tiny_model_dir.name}/torch loaded and warmed up" in err
    assert f"models ['{tiny_model_dir.name}'] on http://127.0.0.1:" in err


def test_a_mistyped_folder_is_named_as_missing(capsys):
    from tests.helpers import free_port

    assert main(["serve", "runs/my-modle", "--port", str(free_port())]) == 2
    assert "the model folder 'runs/my-modle' does not exist" in capsys.readouterr().err
