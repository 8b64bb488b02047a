"""What a model folder says reaches the API: its generation_config.json is the default of a request that names
none (`--generation-config auto`, or the built-in defaults with `vllm`), its chat format frames the conversation, and
a bad file is a 503 naming it, while the server's other models are served."""

from __future__ import annotations

import json
import shutil

import pytest
from fastapi.testclient import TestClient

from gpt_serve import CharTokenizer
from gpt_serve.chargpt.chat_format import PLAIN
from gpt_serve.generation import SamplingParams, generate_text
from gpt_serve.serving.api import create_app
from gpt_serve.serving.registry import ModelRegistry


@pytest.fixture(scope="module")
def root(tmp_path_factory, tiny_model_dir):
    """`greedy` (its folder: 7 tokens, do_sample false), `plain` (User/Assistant), `broken` (temperature 9)."""
    root = tmp_path_factory.mktemp("folder-settings")
    for name in ("greedy", "plain", "broken"):
        shutil.copytree(tiny_model_dir, root / name)
    edit(root / "greedy" / "generation_config.json", max_new_tokens=7, do_sample=False)
    edit(root / "broken" / "generation_config.json", temperature=9)
    tokenizer = CharTokenizer.from_pretrained(tiny_model_dir)
    CharTokenizer(chars=tokenizer.vocab.chars, chat_format=PLAIN).save_pretrained(root / "plain")
    return root


def edit(path, **values):
    path.write_text(json.dumps({**json.loads(path.read_text()), **values}))


def client(root, mode="auto") -> TestClient:
    registry = ModelRegistry.discover(models_root=root, expected=(), threads=1, generation_config=mode)
    return TestClient(create_app(registry))


def greedy_text(root, prompt: str, n: int) -> str:
    registry = ModelRegistry.discover(models_root=root, expected=(), threads=1)
    loaded = registry.backend("greedy", "torch")
    return generate_text(loaded.backend, loaded.vocab, prompt, n, SamplingParams(0.0), seed=0)


def test_the_folders_generation_config_is_the_default(root):
    api = client(root)
    out = api.post("/v1/completions", json={"model": "greedy", "prompt": "ROMEO:", "seed": 1}).json()
    assert out["usage"]["completion_tokens"] == 7 and out["choices"][0]["text"] == greedy_text(root, "ROMEO:", 7)
    # the request's own values win
    out = api.post("/v1/completions", json={"model": "greedy", "prompt": "ROMEO:", "max_tokens": 3}).json()
    assert out["usage"]["completion_tokens"] == 3
    sampled = [
        api.post("/v1/completions", json={"model": "greedy", "prompt": "A", "temperature": 2, "seed": s}).json()
        for s in range(4)
    ]
    assert len({o["choices"][0]["text"] for o in sampled}) > 1  # temperature 2 samples: not the folder's greedy


def test_vllm_mode_ignores_the_folder(root):
    out = client(root, "vllm").post("/v1/completions", json={"model": "greedy", "prompt": "ROMEO:"}).json()
    assert out["usage"]["completion_tokens"] == 256  # the request specification's default


def test_a_bad_generation_config_is_a_503_naming_file_and_field(root):
    api = client(root)
    response = api.post("/v1/completions", json={"model": "broken", "prompt": "ROMEO:"})
    assert response.status_code == 503
    message = response.json()["error"]["message"]
    assert f"{root / 'broken' / 'generation_config.json'}: temperature must be a number in [0, 2]" in message
    chat = api.post("/v1/chat/completions", json={"model": "broken", "messages": [{"role": "user", "content": "x"}]})
    assert chat.status_code == 503 and "generation_config.json: temperature" in chat.json()["error"]["message"]
    assert api.post("/v1/completions", json={"model": "greedy", "prompt": "A"}).status_code == 200  # the others serve
    assert client(root, "vllm").post("/v1/completions", json={"model": "broken", "prompt": "A"}).status_code == 200


def test_chat_speaks_in_the_folders_format(root):
    api = client(root)
    body = {"model": "plain", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}
    out = api.post("/v1/chat/completions", json=body).json()
    registry = ModelRegistry.discover(models_root=root, expected=(), threads=1)
    loaded = registry.backend("plain", "torch")
    free = generate_text(loaded.backend, loaded.vocab, "User:\nHi\n\nAssistant:\n", 4, SamplingParams(0.0), seed=0)
    assert out["choices"][0]["message"]["content"] == free.split("\n\n")[0]
    assert out["usage"]["prompt_tokens"] == len("User:\nHi\n\nAssistant:\n")


def test_a_model_without_a_chat_format_says_so(root, tmp_path):
    shutil.copytree(root / "greedy", tmp_path / "nochat")
    edit(tmp_path / "nochat" / "tokenizer_config.json", chat_format=None)
    (tmp_path / "nochat" / "chat_template.jinja").unlink()
    api = client(tmp_path)
    response = api.post(
        "/v1/chat/completions", json={"model": "nochat", "messages": [{"role": "user", "content": "x"}]}
    )
    assert response.status_code == 400 and "has no chat format" in response.json()["error"]["message"]
    (tmp_path / "nochat" / "chat_template.jinja").write_text("{{ messages }}")
    edit(tmp_path / "nochat" / "tokenizer_config.json", chat_format={"user": "ROMEO"})
    response = client(tmp_path).post(
        "/v1/chat/completions", json={"model": "nochat", "messages": [{"role": "user", "content": "x"}]}
    )
    assert response.status_code == 503 and "chat_template.jinja is not the template of" in response.text


def test_preload_names_a_bad_generation_config(root):
    registry = ModelRegistry.discover(models_root=root, expected=(), threads=1)
    loaded, line = registry.preload("torch", "broken")
    assert not loaded and "generation_config.json: temperature must be" in line
