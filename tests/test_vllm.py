"""vLLM's CPU build runs our folders through its Transformers backend and gives our greedy tokens (docs/serving.md,
"In vLLM").

Two vLLM processes per session, in the venv `make vllm` creates (`tests/vllm_venv.py`): its OpenAI-compatible server,
started with the flags docs/serving.md gives, on a `gpt-serve copy` of the shipped model (completions, a stream,
the window), and one offline engine (`tests/vllm_generate.py`) that runs the other folders in turn: the shipped
ladder-a, models with the config switches other checkpoints use (GELU, tied head, no biases, qkv bias, the
`n_embd` attention scale, stage C's feed-forward), an imported nanoGPT checkpoint, and ladder-b, whose head size 8
vLLM's CPU attention refuses.
Skipped, with the reason, where vLLM cannot be installed; offline (`tests/vllm_venv.ENV`).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import vllm_venv
from chat_elsewhere import MESSAGES, our_chat, result, script_args, with_stop
from chat_elsewhere import TOKENS as CHAT_TOKENS
from conftest import make_tiny_model

from gpt_serve import CharGPTForCausalLM, CharTokenizer
from gpt_serve.cli import main as gpt_serve_cli
from gpt_serve.generation import SamplingParams, generate_tokens, load_backend
from gpt_serve.models import model_path

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "serving.md"
PROMPTS = ["ROMEO:", "JULIET:\nO Romeo, Romeo! wherefore art thou", "First Citizen:\nBefore we proceed"]
TOKENS = 60
LOGPROB_TOLERANCE = 1e-3  # fp32, different kernels (vLLM's CPU attention, its Linear layers): ~1e-5 seen

# Folders for the offline engine: what other checkpoints switch (each head of 32 channels: vLLM's CPU attention
# takes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512). A wide init, so that greedy text does not repeat one
# character (a tied head with small weights echoes its input) and a wrong switch shows in the tokens.
SWITCHES = {
    "nanogpt-no-bias": dict(activation="gelu", tie_word_embeddings=True, bias=False, layer_norm_bias=False),
    "qkv-bias-stage-c-n-embd-scale": dict(
        qkv_bias=True, lm_head_bias=False, ffwd_mult=1, ffwd_proj=False, attn_scale="n_embd"
    ),
}
SWITCH_SHAPE = dict(block_size=32, n_embd=64, n_head=2, n_layer=2, initializer_range=0.3)


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    return vllm_venv.python_or_skip()  # missing on a machine that could have it: the test fails, saying `make vllm`


def ours(folder: Path, prompts: list[list[int]], tokens: int) -> tuple[list[list[int]], list[list[float]]]:
    """Our engine's greedy tokens (the torch backend's scheduler, inside the window), and each one's logprob under
    the model (one forward over prompt + tokens)."""
    loaded = load_backend(str(folder), "torch", 1)
    block_size = loaded.block_size
    model = CharGPTForCausalLM.from_pretrained(folder).eval()
    all_tokens, all_logprobs = [], []
    for prompt in prompts:
        n = min(tokens, block_size - len(prompt))
        row = [int(t[0]) for t in generate_tokens(loaded.backend, [prompt], n, SamplingParams(0.0), seed=0)]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + row])).logits[0]
        logprobs = torch.log_softmax(logits, dim=-1)[len(prompt) - 1 : -1]
        all_tokens.append(row)
        all_logprobs.append([float(logprobs[i, t]) for i, t in enumerate(row)])
    return all_tokens, all_logprobs


def encode(texts: list[str]) -> list[list[int]]:
    tokenizer = CharTokenizer.from_pretrained(model_path("shakespeare"))
    return [tokenizer.encode(text) for text in texts]


# --- the OpenAI-compatible server, started as docs/serving.md says ---------------------------------------------


def documented_server_args() -> list[str]:
    """The arguments of the server command in docs/serving.md's "In vLLM" section, less `--host` and `--port`."""
    section = DOC.read_text(encoding="utf-8").split("\n## In vLLM", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    command = next(b for b in blocks if "vllm.entrypoints.openai.api_server" in b).replace("\\\n", " ")
    line = next(line for line in command.splitlines() if "vllm.entrypoints.openai.api_server" in line)
    words = shlex.split(line.split("#", 1)[0])
    environment = dict(w.split("=", 1) for w in words[: words.index(next(w for w in words if "python" in w))])
    assert environment.items() <= vllm_venv.ENV.items(), environment  # what the doc sets, the tests set
    args = words[words.index("vllm.entrypoints.openai.api_server") + 1 :]
    for flag in ("--host", "--port"):
        i = args.index(flag)
        del args[i : i + 2]
    return args


@pytest.fixture(scope="module")
def copied(tmp_path_factory) -> Path:
    """`gpt-serve copy shakespeare OUT`: the shipped folder with its code, as the docs tell a vLLM user."""
    out = tmp_path_factory.mktemp("vllm") / "shakespeare-hf"
    assert gpt_serve_cli(["copy", "shakespeare", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def server(vllm_python, copied, tmp_path_factory):
    args = documented_server_args()
    args[args.index("--model") + 1] = str(copied)
    log = tmp_path_factory.mktemp("vllm-log") / "server.log"
    with vllm_venv.serving(args, log) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_documented_command_serves_a_copied_shipped_model_with_our_greedy_tokens(client, copied):
    """The issue's check: `gpt-serve copy shakespeare`, vLLM serves it, and its greedy tokens (and their logprobs) are
    our engine's, for three prompts in one request (vLLM batches them)."""
    assert [(m.id, m.max_model_len) for m in client.models.list().data] == [("shakespeare", 128)]
    prompts = encode(PROMPTS)
    expected, expected_logprobs = ours(copied, prompts, TOKENS)
    extra = {"return_token_ids": True}
    answer = client.completions.create(
        model="shakespeare", prompt=prompts, max_tokens=TOKENS, temperature=0, logprobs=0, extra_body=extra
    )
    choices = sorted(answer.choices, key=lambda c: c.index)
    assert [c.token_ids for c in choices] == expected
    tokenizer = CharTokenizer.from_pretrained(copied)
    assert [c.text for c in choices] == [tokenizer.decode(row) for row in expected]
    for choice, logprobs in zip(choices, expected_logprobs):
        np.testing.assert_allclose(choice.logprobs.token_logprobs, logprobs, atol=LOGPROB_TOLERANCE)


def test_a_text_prompt_and_a_stream_give_the_same_text(client, copied):
    """vLLM encodes text with the folder's tokenizer.json (our ids) and streams the same greedy text in pieces."""
    (expected,), _ = ours(copied, encode(["ROMEO:"]), 30)
    text = CharTokenizer.from_pretrained(copied).decode(expected)
    answer = client.completions.create(model="shakespeare", prompt="ROMEO:", max_tokens=30, temperature=0)
    assert answer.choices[0].text == text and answer.usage.prompt_tokens == 6
    chunks = client.completions.create(model="shakespeare", prompt="ROMEO:", max_tokens=30, temperature=0, stream=True)
    pieces = [c.choices[0].text for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 1 and "".join(pieces) == text


def test_vllm_does_not_slide_the_window(client):
    """What differs from `gpt-serve serve`: the text stops at block_size (prompt + tokens), and more tokens than the
    window are refused."""
    import openai

    answer = client.completions.create(model="shakespeare", prompt="ROMEO:", max_tokens=125, temperature=0)
    assert answer.usage.completion_tokens == 128 - 6 and answer.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="max_model_len=128"):
        client.completions.create(model="shakespeare", prompt="ROMEO:", max_tokens=200)


def test_chat_through_the_folders_template_gives_our_greedy_reply(client, copied):
    """vLLM renders the copy's chat_template.jinja (our server's prompt: the same prompt token count) and, told where
    a speech ends (`stop`), answers our server's greedy reply."""
    prompt, reply, finish_reason = our_chat(copied)
    answer = client.chat.completions.create(
        model="shakespeare", messages=MESSAGES, max_tokens=CHAT_TOKENS, temperature=0, stop=["\n\n"]
    )
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.choices[0].message.content == reply and answer.choices[0].finish_reason == finish_reason


def test_transformers_in_vllms_venv_chats_with_the_copy(vllm_python, copied, tmp_path):
    """A venv with transformers and torch but no gpt-serve (vLLM's): `apply_chat_template` and `pipeline` chat as our
    server does."""
    prompt, reply, finish_reason = our_chat(copied)
    done = subprocess.run(
        [str(vllm_python), *script_args(copied)], env=vllm_venv.env(threads=1), cwd=tmp_path, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = result(done.stdout)
    assert got["prompt"] == prompt and got["reply"]["content"] == with_stop(reply, finish_reason)


# --- the offline engine over the other folders ------------------------------------------------------------------


def imported_nanogpt(root: Path, corpus: str) -> Path:
    """`gpt-serve import` of a nanoGPT checkpoint (GELU, tied head, bias=False; heads of 32), trained a few steps on
    Tiny Shakespeare."""
    from gpt_serve.folders.importing import import_checkpoint
    from tests.folders.checkpoint_sources import GPT, save_nanogpt, train_a_little

    tokenizer = CharTokenizer.from_pretrained(model_path("shakespeare"))
    chars = tokenizer.vocab.chars
    torch.manual_seed(7)
    nanogpt = GPT(len(chars), n_embd=64, n_head=2, n_layer=2, block_size=32, bias=False, dropout=0.0)
    train_a_little(nanogpt, torch.tensor(tokenizer.encode(corpus[:20_000])))
    import_checkpoint(save_nanogpt(nanogpt, root / "nanoGPT", list(chars)), root / "imported-nanogpt")
    return root / "imported-nanogpt"


@pytest.fixture(scope="module")
def offline(vllm_python, tmp_path_factory, corpus) -> tuple[dict, dict]:
    """({name: folder}, {folder: vLLM's result}) for ladder-a (copied), the switch models, and ladder-b (last: its
    failure ends the process's use of vLLM)."""
    root = tmp_path_factory.mktemp("vllm-offline")
    folders = {}
    for name in ("ladder-a", "ladder-b"):
        folders[name] = root / name
        assert gpt_serve_cli(["copy", name, str(folders[name])]) == 0
    tokenizer = CharTokenizer.from_pretrained(model_path("shakespeare"))
    for seed, (name, switches) in enumerate(SWITCHES.items()):
        model = make_tiny_model(seed=seed, **SWITCH_SHAPE, **switches)
        model.config.vocab_sha256 = tokenizer.vocab.sha256
        folders[name] = root / name
        model.save_pretrained(folders[name])  # a saved model: its code and auto_map are in the folder
        tokenizer.save_pretrained(folders[name])
    folders["imported-nanogpt"] = imported_nanogpt(root, corpus)
    order = ["ladder-a", *SWITCHES, "imported-nanogpt", "ladder-b"]
    out = root / "results.json"
    result = subprocess.run(
        [str(vllm_python), str(ROOT / "tests" / "vllm_generate.py"), str(out), "20", *(str(folders[n]) for n in order)],
        input=json.dumps(encode(["ROMEO", "\n"])),
        env=vllm_venv.env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0 and out.is_file(), result.stdout[-3000:] + result.stderr[-3000:]
    return folders, json.loads(out.read_text())


@pytest.mark.parametrize("name", ["ladder-a", *SWITCHES, "imported-nanogpt"])
def test_vllm_gives_our_greedy_tokens_for_every_config_switch(offline, name):
    """A shipped folder copied, saved models (as training saves them) with each switch, an imported checkpoint."""
    folders, results = offline
    got = results[str(folders[name])]
    assert "error" not in got, got["error"]
    expected, expected_logprobs = ours(folders[name], encode(["ROMEO", "\n"]), 20)
    assert got["tokens"] == expected
    if name in SWITCHES:  # wide weights: a text, not one character repeated (a tied head would show a wrong tie)
        assert len({t for row in expected for t in row}) > 3
    for logprobs, want in zip(got["logprobs"], expected_logprobs):
        np.testing.assert_allclose(logprobs, want, atol=LOGPROB_TOLERANCE)


def test_vllm_refuses_a_head_size_its_cpu_attention_lacks(offline):
    """ladder-b..e have heads of 8 channels (32 / 4): vLLM loads the folder, then its CPU attention refuses."""
    folders, results = offline
    assert "head_dim=8" in results[str(folders["ladder-b"])].get("error", ""), results[str(folders["ladder-b"])]


def test_vllm_fails_a_constrained_request_on_our_folder_with_a_500(client):
    """The same choice constraint that our server honours (tests/serving/test_api_structured.py), sent to vLLM on a
    copy of our folder: vLLM 0.32's CPU build answers 500 "Internal server error" (its structured-output backends
    want a tokenizer with an EOS token; docs/structured.md, "Beside vLLM"), and serves the next plain request."""
    import openai

    body = {"structured_outputs": {"choice": ["Ay.", "No, my lord."]}}
    with pytest.raises(openai.InternalServerError):
        client.completions.create(
            model="shakespeare", prompt="Wilt thou?\n", max_tokens=20, temperature=0, extra_body=body
        )
    answer = client.completions.create(model="shakespeare", prompt="Wilt thou?\n", max_tokens=5, temperature=0)
    assert len(answer.choices[0].text) == 5
