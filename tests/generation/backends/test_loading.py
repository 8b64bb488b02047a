"""load_backend: one loader for every backend, with the same checks of the folder before anything runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from gpt_serve.generation import BACKENDS, LoadedModel, load_backend
from gpt_serve.generation.backends.onnx_backend import OnnxBackend
from gpt_serve.generation.backends.torch_backend import TorchBackend
from tests.conftest import edit_json


def copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / "m"))


@pytest.mark.parametrize("key", list(BACKENDS))
def test_every_backend_loads_from_a_name_or_a_folder(exported_dir, key):
    loaded = load_backend(exported_dir, key, threads=1)
    assert isinstance(loaded, LoadedModel) and loaded.backend_key == key and loaded.folder.path == exported_dir
    assert isinstance(loaded.backend, TorchBackend if key == "torch" else OnnxBackend)
    assert len(loaded.vocab) == 65 and loaded.block_size == 16
    assert load_backend("ladder-a", key, threads=1).block_size == 8  # a shipped model, by name


def test_the_backends_give_the_same_logits(exported_dir):
    ids = np.array([[1, 2, 3]])
    mask, positions = np.ones_like(ids), np.arange(3)[None]
    torch_logits, _ = load_backend(exported_dir, "torch").backend.forward(ids, mask, positions, None)
    onnx_logits, _ = load_backend(exported_dir, "onnx", threads=1).backend.forward(ids, mask, positions, None)
    np.testing.assert_allclose(torch_logits, onnx_logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("ladder-a", "cuda"), "unknown backend 'cuda'; choose one of \\['torch', 'onnx', 'onnx-int8'\\]"),
        (("ladder-a", "torch", 0), "threads must be None .* or an integer in \\[1, \\d+\\] .*, got 0"),
        (("no-such-model", "torch"), "unknown model 'no-such-model'"),
    ],
)
def test_bad_arguments_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        load_backend(*args)


@pytest.mark.parametrize("key", list(BACKENDS))
def test_a_vocabulary_of_the_wrong_size_is_refused_by_every_backend(exported_dir, tmp_path, key):
    folder = copy(exported_dir, tmp_path)
    edit_json(folder / "vocab.json", lambda vocab: vocab.pop(max(vocab, key=vocab.get)))  # 64 for a 65-row model
    with pytest.raises(ValueError, match="vocab.json has 64 characters but .*config.json says .* vocab_size 65"):
        load_backend(folder, key)


@pytest.mark.parametrize("key", list(BACKENDS))
def test_a_vocabulary_with_swapped_characters_is_refused_by_every_backend(exported_dir, tmp_path, key):
    folder = copy(exported_dir, tmp_path)
    edit_json(folder / "vocab.json", lambda vocab: vocab.update(a=vocab["e"], e=vocab["a"]))  # the wrong letters
    (folder / "tokenizer.json").unlink()  # else that file's disagreement is reported first
    with pytest.raises(ValueError, match="vocab.json is not the vocabulary the model was trained with"):
        load_backend(folder, key)


@pytest.mark.parametrize("key", list(BACKENDS))
def test_a_tokenizer_json_that_disagrees_with_vocab_json_is_refused(exported_dir, tmp_path, key):
    folder = copy(exported_dir, tmp_path)
    edit_json(folder / "tokenizer.json", lambda fast: fast["model"]["vocab"].update(a=64))
    with pytest.raises(ValueError, match="tokenizer.json and .*vocab.json disagree on the vocabulary"):
        load_backend(folder, key)
    (folder / "tokenizer.json").write_text("{", encoding="utf-8")
    with pytest.raises(ValueError, match="tokenizer.json is not a readable tokenizers file"):
        load_backend(folder, key)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("[1, 2]", "must hold a JSON object, got a list"),
        ('{"model_type": "gpt2"}', "is the config of a 'gpt2' model, not a 'chargpt' one"),
        ("{not json", "cannot read .*config.json"),
    ],
)
def test_a_bad_config_is_named(exported_dir, tmp_path, config, message):
    folder = copy(exported_dir, tmp_path)
    (folder / "config.json").write_text(config, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        load_backend(folder, "torch")


def test_pickled_or_missing_weights_are_refused(exported_dir, tmp_path):
    folder = copy(exported_dir, tmp_path)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match=r"has no model.safetensors \(found: \['pytorch_model.bin'\]\)"):
        load_backend(folder, "torch")


@pytest.mark.parametrize("damage", ["truncate", "empty"])
def test_truncated_weights_are_named(exported_dir, tmp_path, damage):
    folder = copy(exported_dir, tmp_path)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 100 if damage == "truncate" else 0])
    with pytest.raises(ValueError, match="model.safetensors"):
        load_backend(folder, "torch")


def test_weights_of_another_model_are_refused(exported_dir, tmp_path):
    from safetensors.torch import save_file

    from tests.conftest import make_tiny_model

    folder = copy(exported_dir, tmp_path)
    other = make_tiny_model(n_layer=1).state_dict()  # a layer short: missing tensors
    save_file({k: v.contiguous() for k, v in other.items()}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="does not hold this model's weights \\(missing keys: \\['model.blocks.1"):
        load_backend(folder, "torch")
