"""Over the API: one request cannot take the engine (a 1-token request beside one that holds every row gets its
answer while the other goes on), nor ask more than the server's caps (a 400 naming the cap), and streamed logprobs,
forgotten once sent, are those of the whole answer."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.serving.conftest import assert_openai_error, post

CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        # the issue's: all 16 rows for 100,000 tokens
        ("/v1/completions", {"n": 16, "max_tokens": 100_000}, "16 choices x max_tokens 100,000 = 1,600,000 tokens is "
         "over this server's limit of 262,144 tokens a request (--max-request-tokens)"),
        ("/v1/completions", {"prompt": ["a", "b"], "n": 2, "max_tokens": 70_000}, "4 choices x max_tokens 70,000"),
        # the issue's: RSS 207 -> 598 MB and a 61 MB answer
        ("/v1/completions", {"n": 16, "logprobs": 20, "max_tokens": 8000}, "16 choices x max_tokens 8,000 x 21 "
         "logprobs a token = 2,688,000 logprobs is over this server's limit of 2,097,152 a request "
         "(--max-request-logprobs)"),
        ("/v1/chat/completions", {**CHAT, "n": 16, "logprobs": True, "top_logprobs": 20, "max_tokens": 8000},
         "= 2,688,000 logprobs"),
    ],
)  # fmt: skip
def test_a_request_over_the_caps_is_refused_naming_the_cap(url, path, body, message):
    assert_openai_error(post(url, path, json.dumps({"model": "tiny", **body}).encode()), 400, message)


def test_a_one_token_request_beside_one_that_holds_every_row_is_answered_while_it_runs(url, registry):
    """16 streamed choices of 16,000 tokens hold all 16 rows; a 1-token request sent once they run is answered
    (its row taken from one of them, which rejoins later) while they go on."""
    scheduler = registry.scheduler("tiny", "torch")
    greedy = {"model": "tiny", "n": 16, "max_tokens": 16_000, "stream": True, "seed": 1}
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{url}/v1/completions", json=greedy) as held:
        lines = held.iter_lines()
        assert next(lines).startswith("data: ")
        assert scheduler.stats()["active"] == 16
        one = client.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "a", "max_tokens": 1, "seed": 0})
        assert one.status_code == 200 and len(one.json()["choices"][0]["text"]) == 1
        stats = scheduler.stats()
        assert stats["preempted"] >= 1 and stats["active"] + stats["waiting"] >= 16  # the 16 still run
        assert stats["tokens"] < 16 * 16_000


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_streamed_logprobs_are_those_of_the_whole_answer(url, path):
    body = {"model": "tiny", "max_tokens": 300, "seed": 3, "temperature": 0.9, "n": 2}
    chat = {**CHAT, "logprobs": True, "top_logprobs": 3, "stop": ["zzz"]}
    body |= chat if "chat" in path else {"prompt": "ROMEO:", "logprobs": 3}
    whole = httpx.post(url + path, json=body, timeout=60).json()["choices"]
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as answer:
        chunks = [json.loads(line[6:]) for line in answer.iter_lines() if line.startswith("data: {")]
    for choice in whole:
        items = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == choice["index"]]
        streamed = [item["logprobs"] for item in items if item["logprobs"]]
        if "chat" in path:
            assert [e for s in streamed for e in s["content"]] == choice["logprobs"]["content"]
        else:
            for key in ("tokens", "token_logprobs", "top_logprobs"):
                assert [e for s in streamed for e in s[key]] == choice["logprobs"][key], key
