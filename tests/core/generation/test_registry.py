"""The model registry: names, folders, backends by key or label, loading once, without a server."""

from __future__ import annotations

import pytest

from gpt_serve.generation.registry import (
    ModelRegistry,
    ModelUnavailable,
    RequestError,
    parse_model_dir,
    resolve_backend,
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
    with pytest.raises(RequestError, match="choose one of 'torch' \\(PyTorch\\), 'onnx'"):
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
