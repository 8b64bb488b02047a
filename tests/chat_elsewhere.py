"""Chat with a `gpt-serve copy` folder in plain transformers (no gpt-serve): the script a user would run
(`apply_chat_template`, then `pipeline("text-generation")` with messages, greedy, stopping at the end of the speech),
and what gpt-serve's own server answers, for tests/chargpt/test_chat_without_gpt_serve.py (this venv, gpt_serve
blocked) and tests/test_vllm.py (vLLM's venv, which has transformers and not gpt-serve)."""

from __future__ import annotations

import json
from pathlib import Path

MESSAGES = [
    {"role": "system", "content": "A street in Verona."},
    {"role": "user", "content": "Wherefore art thou?"},
]  # the shipped model's greedy reply ends within TOKENS: "What said is the sea?", then the blank line
TOKENS = 60

SCRIPT = """
import json, sys
from transformers import AutoTokenizer, pipeline

folder, messages, tokens = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
chat = pipeline("text-generation", model=folder, tokenizer=tokenizer, trust_remote_code=True)
out = chat(messages, max_new_tokens=tokens, do_sample=False, stop_sequence="\\n\\n")
print("RESULT " + json.dumps({"prompt": prompt, "reply": out[0]["generated_text"][-1]}))
"""


def script_args(folder: Path) -> list[str]:
    return ["-c", SCRIPT, str(folder), json.dumps(MESSAGES), str(TOKENS)]


def result(stdout: str) -> dict:
    line = next(line for line in stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line.removeprefix("RESULT "))


def our_chat(folder: Path) -> tuple[str, str, str]:
    """(the prompt, the greedy reply, its finish_reason) of gpt-serve's server for `MESSAGES` on the model in
    `folder`."""
    from fastapi.testclient import TestClient

    from gpt_serve.chargpt.chat_format import PLAY, render
    from gpt_serve.serving.api import create_app
    from gpt_serve.serving.registry import ModelRegistry

    registry = ModelRegistry({"m": folder}, threads=1)
    body = {"model": "m", "messages": MESSAGES, "max_tokens": TOKENS, "temperature": 0}
    answer = TestClient(create_app(registry)).post("/v1/chat/completions", json=body).json()
    registry.close()
    (choice,) = answer["choices"]
    return render(MESSAGES, None, PLAY), choice["message"]["content"], choice["finish_reason"]


def with_stop(reply: str, finish_reason: str) -> str:
    """Our reply as transformers gives it: with the stop string it ended at (transformers keeps it)."""
    return reply + "\n\n" if finish_reason == "stop" else reply
