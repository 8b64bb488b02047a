"""The served app over the wire, with gradio_client: the /generate API, streaming, 16 users at once, cancelling,
bad input, and the CLI."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from gpt_serve.generation import SamplingParams, generate_text
from tests.demo.conftest import free_port, wait_idle, wait_until

API_PARAMETERS = ["prompt", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "backend", "model"]


@pytest.fixture(scope="module")
def client(server):
    return Client(server.url, verbose=False)


def test_generate_is_the_only_public_endpoint_and_has_named_parameters(client):
    api = client.view_api(return_format="dict", print_info=False)
    assert list(api["named_endpoints"]) == ["/generate"] and not api["unnamed_endpoints"]
    names = [p["parameter_name"] for p in api["named_endpoints"]["/generate"]["parameters"]]
    assert names[: len(API_PARAMETERS)] == API_PARAMETERS
    assert names[len(API_PARAMETERS) :] == ["window_mode", "unk_policy", "structured_outputs"]  # optional extras


def test_the_api_page_describes_every_parameter_with_its_choices(client, registry):
    endpoint = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]
    assert endpoint["description"].startswith("Streams the continuation of a prompt")
    parameters = {p["parameter_name"]: p for p in endpoint["parameters"]}
    undescribed = [name for name, p in parameters.items() if not p["python_type"]["description"]]
    assert not undescribed and [p["label"] for p in parameters.values()] == list(parameters)
    assert "0 is greedy" in parameters["temperature"]["python_type"]["description"]
    assert parameters["backend"]["type"]["enum"] == ["torch", "onnx", "onnx-int8"]
    assert parameters["model"]["type"]["enum"] == list(registry.names)
    assert parameters["model"]["parameter_default"] == "tiny"  # the server's default, not None
    assert parameters["window_mode"]["type"]["enum"] == ["exact", "refill"]
    assert parameters["unk_policy"]["type"]["enum"] == ["error", "drop", "replace"]
    # None: the model folder's default (its generation_config.json)
    assert parameters["max_new_tokens"]["python_type"]["type"] == "None | int"
    assert parameters["max_new_tokens"]["parameter_default"] is None
    assert parameters["structured_outputs"]["parameter_default"] is None
    assert '{"choice": [A, B]}' in parameters["structured_outputs"]["python_type"]["description"]
    (output,) = endpoint["returns"]
    assert output["python_type"]["type"] == "str"


def test_the_mcp_server_offers_generate_as_a_described_tool(registry):
    """`python -m demo --mcp`: Gradio's MCP server, whose tool schema comes from the same docstring and types."""
    import json
    import urllib.request

    pytest.importorskip("mcp", reason="Gradio's MCP support is not installed (pip install 'gpt-serve[mcp]')")
    from demo.app import build_demo

    blocks = build_demo(registry, default_model="tiny")
    blocks.launch(
        server_name="127.0.0.1",
        server_port=free_port(),
        prevent_thread_lock=True,
        quiet=True,
        ssr_mode=False,
        mcp_server=True,
    )
    try:
        with urllib.request.urlopen(blocks.local_url + "gradio_api/mcp/schema", timeout=30) as response:
            tools = json.load(response)
    finally:
        blocks.close()
    (tool,) = [t for t in tools if t["name"].endswith("generate")]
    assert tool["description"].startswith("Streams the continuation of a prompt")
    properties = tool["inputSchema"]["properties"]
    assert properties["window_mode"]["enum"] == ["exact", "refill"]
    assert "0 is greedy" in properties["temperature"]["description"]


def test_cli_mcp_without_the_extra_names_it(monkeypatch, capsys):
    import importlib.util

    from demo.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mcp" else real(name, *a))
    assert main(["--mcp", "--no-preload"]) == 2
    assert "pip install 'gpt-serve[mcp]'" in capsys.readouterr().err


def test_streams_over_the_wire(client, server):
    wait_idle(server.activity)
    job = client.submit(prompt="ROMEO:", max_new_tokens=3000, seed=0, model="tiny", api_name="/generate")
    partials = list(job)  # every result the server streamed
    assert len(partials[-1]) == 3000
    assert len(partials) >= 4, f"only {len(partials)} updates arrived"
    assert all(len(a) < len(b) and b.startswith(a) for a, b in zip(partials, partials[1:], strict=False))


def test_sixteen_concurrent_clients_all_get_complete_correct_outputs(server, registry):
    wait_idle(server.activity)
    peak_before = server.activity.snapshot()["peak"]
    server.activity.peak = 0
    clients = list(ThreadPoolExecutor(16).map(lambda _: Client(server.url, verbose=False), range(16)))

    def run(i):
        return clients[i].predict(prompt="ROMEO:", max_new_tokens=200, seed=i, model="tiny", api_name="/generate")

    with ThreadPoolExecutor(16) as pool:
        outputs = list(pool.map(run, range(16)))
    assert [len(out) for out in outputs] == [200] * 16
    loaded = registry.backend("tiny", "torch")
    for i in (0, 5, 10, 15):  # each got its own stream: the text of its seed
        sampling = SamplingParams(registry.generation_defaults("tiny")["temperature"])  # the folder's: none was sent
        assert outputs[i] == generate_text(loaded.backend, loaded.vocab, "ROMEO:", 200, sampling, seed=i)
    assert server.activity.snapshot()["peak"] > 1, "requests ran one at a time"
    server.activity.peak = max(peak_before, server.activity.peak)


def test_cancelled_job_stops_generating_on_the_server(client, server):
    wait_idle(server.activity)
    activity = server.activity
    before = activity.snapshot()["tokens"]
    job = client.submit(prompt="ROMEO:", max_new_tokens=20_000, seed=0, model="tiny", api_name="/generate")
    assert wait_until(lambda: len(job.outputs()) >= 2, timeout=10)
    job.cancel()
    assert wait_until(lambda: activity.snapshot()["active"] == 0, timeout=1.0), "the generation loop kept running"
    stopped_at = activity.snapshot()["tokens"]
    time.sleep(0.5)
    assert activity.snapshot()["tokens"] == stopped_at, "tokens were still generated after the cancel"
    assert stopped_at - before < 20_000


BAD_API_INPUTS = [
    (dict(prompt="héllo"), "outside this model's vocabulary: 'é' (position 1)"),
    (dict(max_new_tokens=10**9), "max_new_tokens must be an integer in [1, 20000], got 1000000000"),
    (dict(temperature=-2.0), "temperature must be a number in [0, 2] (0 = greedy), got -2"),
    (dict(top_p=0.0), "top_p must be a number in (0, 1], got 0"),
    (dict(top_k=-1), "top_k must be an integer in [0, 1000000] (0 = no limit), got -1"),
    (dict(seed=-7), "seed must be an integer in [0, 9007199254740991] (null or -1 = random), got -7"),
    (dict(backend="tpu"), "backend must be one of 'torch' (PyTorch)"),
    (dict(model="nope"), "unknown model 'nope'"),
    (dict(model="ladder-d"), "model 'ladder-d' is not available on this server"),
    (dict(model="ladder-b", backend="onnx-int8"), "ONNX Runtime int8 is not available for model 'ladder-b'"),
    (dict(structured_outputs={"regex": "[A-Z"}), "structured_outputs.regex: the regex is malformed or unsupported"),
    (dict(structured_outputs={"choice": ["{}"]}), "it lacks the characters '{' '}'"),
    (dict(structured_outputs={"grammar": "start: foo"}), "structured_outputs.grammar: the grammar is malformed"),
    (dict(structured_outputs="Ay."), "structured_outputs must be an object with one of ['regex', 'choice'"),
]


def test_bad_inputs_get_errors_and_the_server_stays_healthy(client, server):
    for bad, message in BAD_API_INPUTS:
        with pytest.raises(AppError) as error:
            client.predict(**{"prompt": "ROMEO:", "model": "tiny", **bad}, api_name="/generate")
        assert message in str(error.value), (bad, str(error.value))
    assert len(client.predict(prompt="ROMEO:", max_new_tokens=25, model="tiny", api_name="/generate")) == 25
    wait_idle(server.activity)


CHOICES = ["Ay.", "No, my lord.", "Nay"]


def test_generate_takes_structured_outputs(client, server):
    """The same field as the OpenAI API's, with the same text as the library for the same seed."""
    wait_idle(server.activity)
    for seed in range(3):
        field = {"choice": CHOICES}
        text = client.predict(
            prompt="ROMEO:", max_new_tokens=30, seed=seed, structured_outputs=field, api_name="/generate"
        )
        assert text in CHOICES
    regex = r"[A-Z][a-z]{2,6}[.!?]"
    text = client.predict(
        prompt="ROMEO:", max_new_tokens=30, seed=4, structured_outputs={"regex": regex}, api_name="/generate"
    )
    assert re.fullmatch(regex, text), text
    loaded = server.demo.registry.backend("tiny", "torch")
    expected = generate_text(
        loaded.backend, loaded.vocab, "ROMEO:", 30, SamplingParams(), seed=4, structured_outputs={"regex": regex}
    )
    assert text == expected


def test_replacement_of_unknown_characters_is_opt_in(client):
    text = client.predict(prompt="héllo", max_new_tokens=10, model="tiny", unk_policy="replace", api_name="/generate")
    assert len(text) == 10


def answers(url: str) -> bool:
    """Whether `url` answers 200 (False for a refused connection or any other status)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def test_cli_starts_quickly_and_serves(models_root, tmp_path):
    """`python -m demo` with a models folder: preloads, binds 127.0.0.1 by default, answers the API; closes a
    connection whose headers do not come within --header-timeout; on SIGTERM, the OpenAI API's open stream ends
    with its `data: [DONE]` after --shutdown-timeout, and the demo exits cleanly."""
    from tests.serving.test_api_lifecycle import closed_within

    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "demo.log"
    cmd = [sys.executable, "-m", "demo", "--models-root", str(models_root), "--model", "tiny", "--port", str(port)]
    cmd += ["--header-timeout", "1", "--shutdown-timeout", "1", "--max-new-tokens-limit", "100000"]  # a long stream
    with open(log, "w") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        assert wait_until(lambda: answers(f"http://127.0.0.1:{port}/") or process.poll() is not None, 60, 0.02)
        # as soon as the page answers, so do the API and the in-browser page (mounted before the server listens)
        assert answers(f"http://127.0.0.1:{port}/v1/models") and answers(f"http://127.0.0.1:{port}/browser/")
        assert wait_until(lambda: "demo: ready" in log.read_text() or process.poll() is not None, 60, 0.1)
        text = log.read_text()
        assert "demo: ready" in text, text
        assert f"http://127.0.0.1:{port}" in text and "tiny/torch loaded and warmed up" in text
        assert "share=True" not in text and "(--share also opens a public *.gradio.live link)" in text  # our flag
        result = Client(f"http://127.0.0.1:{port}/", verbose=False).predict(
            prompt="ROMEO:", max_new_tokens=12, api_name="/generate"
        )
        assert len(result) == 12
        assert f"in-browser page (onnxruntime-web) at http://127.0.0.1:{port}/browser/\n" in text
        config = urllib.request.urlopen(f"http://127.0.0.1:{port}/browser/model/config.json", timeout=10).read()
        assert json.loads(config)["block_size"] == 16  # the default model's
        with socket.create_connection(("127.0.0.1", port)) as slow:
            assert closed_within(slow, 3, b"GET / HTTP/1.1\r\nX-Padding: " + b"x" * 100)[0]
        long = {"model": "tiny", "prompt": "A", "max_tokens": 100_000, "window_mode": "exact", "stream": True}
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=long, timeout=30) as response:
            chunks = response.iter_text()
            text = next(chunks)
            process.terminate()
            text += "".join(chunks)
        assert text.endswith("data: [DONE]\n\n") and '"finish_reason": "abort"' in text[-400:], text[-400:]
        assert process.wait(timeout=10) == 0
        assert "Traceback" not in log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_a_second_ctrl_c_cuts_the_apis_streams_and_the_demo_still_drains(models_root, tmp_path):
    """Ctrl-C twice (SIGINT, then SIGINT again while the demo drains, its deadline far away): the open stream ends at
    once with finish_reason "abort" and `data: [DONE]`, and the demo exits 0 (the second Ctrl-C used to interrupt the
    drain, dropping the stream without its [DONE])."""
    port = free_port()
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "demo.log"
    cmd = [sys.executable, "-m", "demo", "--models-root", str(models_root), "--model", "tiny", "--port", str(port)]
    cmd += ["--shutdown-timeout", "60", "--no-preload", "--max-new-tokens-limit", "100000"]  # a long stream
    with open(log, "w") as out:
        # Ctrl-C as a terminal sends it: a suite started in the background (`make test &`, a CI runner) ignores
        # SIGINT, and a child would inherit that and rightly keep ignoring it
        restore = functools.partial(signal.signal, signal.SIGINT, signal.SIG_DFL)
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, preexec_fn=restore)
    try:
        assert wait_until(lambda: "demo: ready" in log.read_text() or process.poll() is not None, 60, 0.1)
        long = {"model": "tiny", "prompt": "A", "max_tokens": 100_000, "window_mode": "exact", "stream": True}
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=long, timeout=30) as response:
            chunks = response.iter_text()
            text = next(chunks)
            process.send_signal(signal.SIGINT)
            stopping = wait_until(lambda: "demo: stopping" in log.read_text(), 30)
            assert stopping, log.read_text()[-2000:] + thread_stacks(process.pid)
            process.send_signal(signal.SIGINT)
            text += "".join(chunks)
        assert text.endswith("data: [DONE]\n\n") and '"finish_reason": "abort"' in text[-400:], text[-400:]
        assert process.wait(timeout=20) == 0
        assert "Traceback" not in log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=10)


def thread_stacks(pid: int) -> str:
    """Every thread's Python stack in process `pid` (py-spy, where it can attach), to say where a test's server hung."""
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    try:
        dump = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
        return "\n" + dump.stdout + dump.stderr
    except (OSError, subprocess.SubprocessError) as e:
        return f"\n(no stacks: {e})"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "nope"], "unknown model 'nope'"),
        (["--model", "ladder-c"], "model 'ladder-c' is not available"),
        (["--model-dir", "/nonexistent/folder"], "the model folder '/nonexistent/folder' does not exist"),
        (["/nonexistent/folder"], "the model folder '/nonexistent/folder' does not exist"),
        (["/"], "/ is a folder but not a model folder: it has no config.json"),
    ],
)
def test_cli_rejects_bad_models_clearly(models_root, capsys, argv, message):
    from demo.cli import main

    assert main(["--models-root", str(models_root), "--no-preload", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_defaults_bind_localhost_only(monkeypatch):
    from demo.cli import bind_address, build_parser

    monkeypatch.delenv("GRADIO_SERVER_NAME", raising=False)
    monkeypatch.delenv("GRADIO_SERVER_PORT", raising=False)
    args = build_parser().parse_args([])
    assert bind_address(args.host, args.port) == ("127.0.0.1", 7860)
    assert (args.share, args.backend, args.concurrency) == (False, "torch", 16)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--port", "70000"])


def test_the_openai_api_runs_in_the_same_process_with_the_same_tokens(client, server):
    """`python -m demo` also serves POST /v1/completions, through the same schedulers as /generate."""
    import openai

    api = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    out = api.completions.create(model="tiny", prompt="ROMEO:", max_tokens=50, seed=21)  # /generate's defaults
    page = client.predict(prompt="ROMEO:", max_new_tokens=50, seed=21, model="tiny", api_name="/generate")
    assert out.choices[0].text == page and len(page) == 50


def test_with_a_key_the_gradio_api_needs_it_too(registry):
    """The issue's demo with GPT_SERVE_API_KEY: /v1 answered 401, but `POST /gradio_api/call/generate` and
    gradio_client's /generate generated text with no key. Now every way in needs the key: the page's login (any
    name, the key as password), the API's bearer; a body without either is refused from its headers, unread."""
    import http.client
    from urllib.parse import urlsplit

    from gradio_client.exceptions import AuthenticationError

    from demo.app import build_demo
    from tests.demo.conftest import serve

    key = "s3cret"
    with serve(build_demo(registry, default_model="tiny"), registry, api_key=key) as url:
        url = url.rstrip("/")
        refused = httpx.post(f"{url}/gradio_api/call/generate", json={"data": ["ROMEO:", 5]})
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(AuthenticationError):
            Client(url, verbose=False).predict(prompt="ROMEO:", max_new_tokens=5, api_name="/generate")
        body = {"model": "tiny", "prompt": "A", "max_tokens": 3}
        assert httpx.post(f"{url}/v1/completions", json=body).status_code == 401
        split = urlsplit(url)
        connection = http.client.HTTPConnection(split.hostname, split.port, timeout=30)
        connection.putrequest("POST", "/gradio_api/queue/join")
        connection.putheader("Content-Length", str(2**20))
        connection.endheaders()  # and no body: the answer comes from the headers
        assert connection.getresponse().status == 401
        connection.close()
        assert httpx.get(f"{url}/openapi.json").status_code == 404  # FastAPI's own page: off
        assert httpx.get(f"{url}/health").status_code == 200
        text = Client(url, auth=("anyone", key), verbose=False).predict(
            prompt="ROMEO:", max_new_tokens=5, api_name="/generate"
        )
        answer = httpx.post(f"{url}/v1/completions", json=body, headers={"authorization": f"Bearer {key}"})
        assert len(text) == 5 and len(answer.json()["choices"][0]["text"]) == 3


def test_the_apis_answer_during_the_shutdown_says_so(registry):
    """Once the demo drains, a new API request is a 503 that says the server is shutting down (not
    `model_unavailable`)."""
    from demo.app import build_demo, launch_options
    from demo.cli import mount_api

    blocks = build_demo(registry, default_model="tiny")
    app, url, _ = blocks.launch(
        server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True, ssr_mode=False,
        **launch_options(),
    )  # fmt: skip
    try:
        drain = mount_api(app, registry, "torch", 100)
        drain.closing = True  # what the demo's shutdown sets first
        answer = httpx.post(f"{url}v1/completions", json={"model": "tiny", "prompt": "A", "max_tokens": 2})
        error = answer.json()["error"]
        assert answer.status_code == 503 and error["code"] == "server_shutting_down", error
        assert error["message"] == "the server is shutting down"
    finally:
        blocks.close()
