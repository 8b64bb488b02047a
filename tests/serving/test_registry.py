"""The model registry: names, folders, backends by key or label, loading once, without a server."""

from __future__ import annotations

import pytest

from gpt_serve.generation.fields import resolve_backend
from gpt_serve.serving.registry import (
    ModelRegistry,
    ModelUnavailable,
    RequestError,
    parse_model_dir,
)


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ("torch", "torch"),
        ("PyTorch", "torch"),
        ("pytorch", "torch"),
        ("onnx", "onnx"),
        ("ONNX Runtime fp32", "onnx"),
        ("onnx-fp32", "onnx"),
        ("onnx-int8", "onnx-int8"),
        (" ONNX Runtime int8 ", "onnx-int8"),
        ("int8", "onnx-int8"),
    ],
)
def test_backend_names_keys_and_labels(value, key):
    assert resolve_backend(value) == key


@pytest.mark.parametrize("value", ["cuda", "", None, 3])
def test_unknown_backends_are_refused_with_the_choices(value):
    with pytest.raises(RequestError, match="backend must be one of 'torch' \\(PyTorch\\), 'onnx'"):
        resolve_backend(value)


def test_discovery_lists_expected_models_even_when_missing(models_root, tiny_model_dir):
    registry = ModelRegistry.discover([f"mine={tiny_model_dir}"], models_root=models_root)
    assert registry.names == ["shakespeare", "ladder-a", "ladder-b", "ladder-c", "ladder-d", "ladder-e", "mine", "tiny"]
    assert registry.available == ["ladder-a", "ladder-b", "mine", "tiny"]
    assert registry.default_model() == "ladder-a"  # no shakespeare here: the first model present
    assert registry.folder("mine") == tiny_model_dir
    with pytest.raises(ModelUnavailable, match=f"no model folder at {models_root / 'shakespeare'}"):
        registry.folder("shakespeare")
    with pytest.raises(ModelUnavailable, match="trained by `python -m training.ladder`"):
        registry.default_model("ladder-d")


def test_model_dir_specs(tiny_model_dir, tmp_path):
    assert parse_model_dir(str(tiny_model_dir)) == (tiny_model_dir.name, tiny_model_dir)
    assert parse_model_dir(f"my-model={tiny_model_dir}") == ("my-model", tiny_model_dir)
    with pytest.raises(ValueError, match="is not a model folder"):
        parse_model_dir(str(tmp_path))


def test_missing_onnx_files_are_reported_without_loading(registry):
    assert registry.unavailable_reason("tiny", "onnx") is None
    reason = registry.unavailable_reason("ladder-b", "onnx-int8")
    assert "ONNX Runtime int8 is not available for model 'ladder-b'" in reason
    assert "onnx/model_quantized.onnx is missing; export it with `python -m export" in reason


def test_preload_warms_up_the_default_model_or_says_why_it_cannot(models_root):
    registry = ModelRegistry.discover(models_root=models_root, threads=1)
    try:
        model = registry.default_model()
        loaded, line = registry.preload("torch")
        assert loaded and line.startswith(f"{model}/torch loaded and warmed up in ")
        assert (model, "torch") in registry.schedulers() and registry.schedulers()[(model, "torch")].tokens == 8
    finally:
        registry.close()
    no_int8 = ModelRegistry({"ladder-b": models_root / "ladder-b"}, threads=1)
    try:
        loaded, line = no_int8.preload("onnx-int8")
        assert not loaded and line.startswith("ladder-b/onnx-int8 not preloaded: ONNX Runtime int8 is not available")
        assert not no_int8.schedulers()
    finally:
        no_int8.close()


def test_preload_says_why_a_model_with_broken_weights_cannot_be_loaded(models_root, tmp_path):
    """Files present but unreadable pass `unavailable_reason`; loading them fails, and preload says so instead of
    stopping the server."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(models_root / "ladder-a", broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    registry = ModelRegistry({"broken": broken}, threads=1)
    try:
        loaded, line = registry.preload("torch")
        assert not loaded and line.startswith("broken/torch not preloaded: PyTorch cannot serve model 'broken'")
    finally:
        registry.close()


def test_pytorch_models_load_and_decode_on_one_thread_onnx_on_their_own(models_root, monkeypatch):
    """Every PyTorch model of a process is loaded and decoded on the shared runner's thread (a second OpenMP thread
    team slows each decode step up to 3x: see `runner.Runner`); ONNX Runtime schedulers get a thread each."""
    import threading

    import gpt_serve.serving.registry as registry_module

    def thread_name() -> str:
        return threading.current_thread().name

    loads, load = [], registry_module.load_backend
    monkeypatch.setattr(registry_module, "load_backend", lambda *a: (loads.append((a[1], thread_name())), load(*a))[1])
    registry = ModelRegistry.discover(models_root=models_root, threads=1)
    try:
        torch_a, torch_b = (registry.scheduler(name, "torch") for name in ("tiny", "ladder-a"))
        onnx_a, onnx_b = (registry.scheduler("tiny", key) for key in ("onnx", "onnx-int8"))
        assert torch_a.call(thread_name) == torch_b.call(thread_name) == "gpt-serve-torch"
        assert onnx_a.call(thread_name) == onnx_b.call(thread_name) == "gpt-serve-scheduler"
        threads = [s.call(threading.current_thread) for s in (torch_a, torch_b, onnx_a, onnx_b)]
        assert threads[0] is threads[1] and threads[2] is not threads[3]  # one runner for PyTorch, one per ONNX
        assert loads == [("torch", "gpt-serve-torch")] * 2 + [(key, "MainThread") for key in ("onnx", "onnx-int8")]
    finally:
        registry.close()
    assert torch_a.closed and onnx_a.closed


def test_a_server_serves_the_models_it_is_given_the_first_the_default(models_root, tiny_model_dir):
    """`gpt-serve serve MODEL ...`: names and folders in order, renamed by --served-model-name; none: shakespeare."""
    from gpt_serve.models import MODELS_DIR

    alone = ModelRegistry.serving()
    assert alone.names == ["shakespeare"] and alone.folder("shakespeare") == MODELS_DIR / "shakespeare"
    given = ModelRegistry.serving([str(tiny_model_dir), "ladder-a", f"mine={tiny_model_dir}"])
    assert given.names == [tiny_model_dir.name, "ladder-a", "mine"]
    assert given.default_model() == tiny_model_dir.name and given.folder("ladder-a") == MODELS_DIR / "ladder-a"
    renamed = ModelRegistry.serving(["ladder-a", str(tiny_model_dir)], ["stage-a", "tiny-one"])
    assert renamed.names == ["stage-a", "tiny-one"] and renamed.folder("tiny-one") == tiny_model_dir
    rooted = ModelRegistry.serving(["ladder-e"], models_root=models_root)
    assert rooted.names == ["ladder-a", "ladder-b", "tiny", "ladder-e"] and rooted.default_model() == "ladder-e"
    assert ModelRegistry.serving(models_root=models_root).default_model() == "ladder-a"


@pytest.mark.parametrize(
    ("models", "served", "message"),
    [
        (["runs/my-modle"], None, "the model folder 'runs/my-modle' does not exist"),
        (["./my-modle"], None, "the model folder './my-modle' does not exist"),
        (["shakespear"], None, "unknown model 'shakespear': shipped models are \\['shakespeare', "),
        (["mine=/no/such/folder"], None, "--model-dir 'mine=/no/such/folder': the folder /no/such/folder does not"),
        (["ladder-a", "ladder-b"], ["one"], "--served-model-name gives one name per model: 2 model\\(s\\)"),
        (["ladder-a"], ["a b"], "cannot serve a model as 'a b'"),
        (["ladder-a", "ladder-a"], None, "two models are served as 'ladder-a': give each its own --served-model"),
    ],
)
def test_what_a_server_cannot_serve_is_named(models, served, message):
    with pytest.raises(ValueError, match=message):
        ModelRegistry.serving(models, served)


def test_a_models_root_without_models_is_an_error(tmp_path):
    with pytest.raises(ValueError, match=f"no model folder found under {tmp_path} \\(--models-root\\)"):
        ModelRegistry.serving(models_root=tmp_path)
    with pytest.raises(ValueError, match=f"--models-root {tmp_path / 'none'} is not a directory"):
        ModelRegistry.serving(models_root=tmp_path / "none")


def test_the_registry_takes_backend_keys_a_request_resolved_already(registry):
    """A backend's other names (`resolve_backend`) are resolved once, when a request is parsed: the registry takes
    the keys alone and loads nothing for another name."""
    for call in (registry.backend, registry.scheduler, registry.is_loaded):
        with pytest.raises(
            ValueError, match=r"unknown backend 'pytorch'; choose one of \['torch', 'onnx', 'onnx-int8'\]"
        ):
            call("tiny", "pytorch")
    assert registry.unavailable_reason("tiny", "PyTorch") == "unknown backend 'PyTorch'; choose one of " + str(
        ["torch", "onnx", "onnx-int8"]
    )


def test_every_loaded_backend_keeps_prompts_as_the_registry_says(tiny_model_dir):
    """`--prompt-cache-mb`: the bytes each loaded backend's `PromptCache` may hold (0: none); a bad size is refused
    before any model loads."""
    kept = ModelRegistry({"tiny": tiny_model_dir}, threads=1, prompt_cache_bytes=2**20)
    none = ModelRegistry({"tiny": tiny_model_dir}, threads=1, prompt_cache_bytes=0)
    try:
        assert kept.backend("tiny", "torch").backend.prompt_cache.max_bytes == 2**20
        assert none.backend("tiny", "torch").backend.prompt_cache is None
    finally:
        kept.close()
        none.close()
    with pytest.raises(ValueError, match="max_bytes must be an int >= 0, got -1"):
        ModelRegistry({"tiny": tiny_model_dir}, prompt_cache_bytes=-1)
