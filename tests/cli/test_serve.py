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
    import gpt_serve.serving.limits

    created = {}
    real_create_app = gpt_serve.serving.api.create_app

    def create_app(registry, **kwargs):
        created["schedulers"] = dict(registry.schedulers())
        created["registry"] = registry
        return real_create_app(registry, **kwargs)

    monkeypatch.setattr(gpt_serve.serving.api, "create_app", create_app)
    monkeypatch.setattr(gpt_serve.serving.limits, "run_server", lambda *args: None)  # the server is not the point here
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
