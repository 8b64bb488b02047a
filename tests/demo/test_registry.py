"""The demo's model registry and attention view, without a server."""

from __future__ import annotations

import numpy as np
import pytest

from demo.attention import FUTURE, prompt_attention, render_heads
from demo.registry import DemoInputError, ModelRegistry, ModelUnavailable, parse_model_dir, resolve_backend


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
    with pytest.raises(DemoInputError, match="choose one of 'torch' \\(PyTorch\\), 'onnx'"):
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


def test_prompt_attention_is_causal_and_normalized(registry):
    loaded = registry.backend("tiny", "torch")
    weights = prompt_attention(loaded.backend.pretrained, loaded.vocab.encode("First Citizen:\nBefore we proceed"))
    assert weights.shape == (2, 4, 16, 16)  # (layers, heads, T, T): the last block_size = 16 characters
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.all(np.triu(weights, k=1) == 0)


def test_heat_maps_grid_and_masked_future():
    rng = np.random.default_rng(0)
    weights = np.tril(rng.random((6, 5, 5))).astype(np.float32)
    weights /= weights.sum(-1, keepdims=True)
    image = render_heads(weights)
    assert image.dtype == np.uint8 and image.shape[2] == 3
    assert image.shape[1] > image.shape[0]  # 6 heads: 3 columns, 2 rows
    with pytest.raises(ValueError, match="shape \\(n_head, T, T\\)"):
        render_heads(weights[0])
    assert (image == FUTURE).all(axis=-1).any()  # the masked upper triangle is drawn grey


def test_build_demo_with_defaults_loads_nothing(registry):
    from demo.app import build_demo

    fresh = ModelRegistry(registry.folders, threads=1)
    blocks = build_demo(fresh)
    assert blocks.handlers.default_model == "ladder-a" and blocks.handlers.default_backend == "torch"
    assert blocks.handlers.limits.max_new_tokens == 2000
    assert not any(fresh.is_loaded(name, "torch") for name in fresh.available)
