"""The API as Ray Serve replicas (`gpt_serve.serving.ray_serve`, `gpt-serve serve --ray`): the replica header, the
options,
the usage errors, and one real local Ray instance serving the shipped model from two replicas."""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from gpt_serve.cli import main
from gpt_serve.serving.ray_serve import RayServeOptions
from gpt_serve.serving.registry import ModelRegistry
from tests.helpers import wait_until

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "ray-serve.yaml"


@pytest.mark.parametrize("replica_id", ["r-1", None])
def test_answers_name_their_replica_only_when_given_one(models_root, replica_id):
    from fastapi.testclient import TestClient

    from gpt_serve.serving.api import REPLICA_HEADER, create_app

    registry = ModelRegistry.discover(models_root=models_root, expected=(), threads=1)
    with TestClient(create_app(registry, replica_id=replica_id)) as client:
        body = {"model": "tiny", "prompt": "A", "max_tokens": 3, "stream": True}
        answers = [client.get("/health"), client.post("/v1/completions", json=body)]
        answers.append(client.post("/v1/completions", json={"model": "gpt-4"}))
        assert [a.status_code for a in answers] == [200, 200, 404]
        assert answers[1].text.rstrip().endswith("data: [DONE]")
        assert [a.headers.get(REPLICA_HEADER) for a in answers] == [replica_id] * 3


def test_options_take_serve_run_arguments_and_name_bad_ones():
    options = RayServeOptions.model_validate({"replicas": "2", "replica_cpus": "0.5", "backend": "onnx-int8"})
    assert (options.replicas, options.replica_cpus, options.replica_threads) == (2, 0.5, 1)
    assert RayServeOptions(replica_cpus=3).replica_threads == 3 and RayServeOptions(threads=2).replica_threads == 2
    for args, message in [
        ({"replicas": 0}, "replicas\n  Input should be greater than or equal to 1"),
        ({"backend": "cuda"}, "unknown backend 'cuda'; choose one of ['torch', 'onnx', 'onnx-int8']"),
        ({"replica": 2}, "replica\n  Extra inputs are not permitted"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            RayServeOptions.model_validate(args)


def test_each_replica_reads_the_folders_generation_config_unless_told_not_to(models_root):
    """`generation_config` (`gpt-serve serve --ray --generation-config`): the folder's defaults, or vLLM's 'vllm'."""
    from gpt_serve.cli import build_parser
    from gpt_serve.cli.serve import _ray_options

    assert RayServeOptions(models_root=str(models_root)).registry().generation_defaults("tiny")["temperature"] == 0.8
    options = _ray_options(build_parser().parse_args(["serve", "--ray", "--generation-config", "vllm"]))
    assert options.generation_config == "vllm" and options.registry().generation_defaults("shakespeare") == {}
    with pytest.raises(ValueError, match="generation_config\n  Input should be 'auto' or 'vllm'"):
        RayServeOptions(generation_config="folder")


def test_the_prompt_cache_size_reaches_every_replicas_registry():
    """`--prompt-cache-mb` (MiB) -> `prompt_cache_bytes` of `gpt-serve serve`'s registry and of each Ray replica's."""
    from gpt_serve.cli import build_parser
    from gpt_serve.cli.serve import _ray_options
    from gpt_serve.cli.server_flags import prompt_cache_bytes

    args = build_parser().parse_args(["serve", "--ray", "--prompt-cache-mb", "3"])
    assert prompt_cache_bytes(args) == 3 * 2**20
    assert _ray_options(args).registry().prompt_cache_bytes == 3 * 2**20
    assert RayServeOptions().registry().prompt_cache_bytes == 64 * 2**20
    with pytest.raises(ValueError, match="prompt_cache_bytes\n  Input should be greater than or equal to 0"):
        RayServeOptions(prompt_cache_bytes=-1)


def test_a_local_instance_must_have_the_cpus_the_replicas_ask_for():
    from gpt_serve.serving.ray_serve import check_cpus

    check_cpus(2, RayServeOptions(replicas=4, replica_cpus=0.5))
    with pytest.raises(ValueError, match="3 replicas at 1 CPU each need 3 CPUs but the local Ray instance has 2"):
        check_cpus(2, RayServeOptions(replicas=3))


def test_each_replica_finds_the_models_on_its_machine(models_root, tmp_path):
    assert RayServeOptions().registry().available == ["shakespeare"]  # default: the shipped default alone
    named = RayServeOptions(models=("ladder-a", str(models_root / "tiny")), served_model_names=("a", "t"))
    assert named.registry().available == ["a", "t"] and named.registry().default_model() == "a"
    assert RayServeOptions(models_root=str(models_root)).registry().available == ["ladder-a", "ladder-b", "tiny"]
    with pytest.raises(ValueError, match=f"no model folder found under {tmp_path}"):
        RayServeOptions(models_root=str(tmp_path)).registry()


def test_the_documented_serve_run_config_builds_the_application():
    pytest.importorskip("ray.serve")
    from gpt_serve.serving.ray_serve import build_app

    (app,) = yaml.safe_load(CONFIG.read_text())["applications"]
    assert app["import_path"] == "gpt_serve.serving.ray_serve:build_app"
    RayServeOptions.model_validate(app["args"])
    assert type(build_app(app["args"])).__name__ == "Application"


def test_ray_is_imported_only_to_serve_with_it():
    check = (
        "import sys, gpt_serve.cli, gpt_serve.serving.ray_serve; gpt_serve.cli.build_parser(); "
        "print('ray' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_ray_options_are_usage_errors_without_ray_or_out_of_range(capsys):
    assert main(["serve", "--replicas", "2", "--ray-address", "auto"]) == 2
    assert "only with --ray: --replicas, --ray-address" in capsys.readouterr().err
    for flag, value, message in [("--replicas", "0", "an integer >= 1"), ("--replica-cpus", "0", "a number > 0")]:
        with pytest.raises(SystemExit) as exc:
            main(["serve", "--ray", flag, value])
        assert exc.value.code == 2 and f"{flag}: must be {message}, got {value}" in capsys.readouterr().err


def test_ray_not_installed_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now fails as if it were not installed
    assert main(["serve", "--ray"]) == 2
    err = capsys.readouterr().err
    assert "needs the 'ray' extra (cannot import ray): pip install 'gpt-serve[ray]'" in err
    assert len(err.splitlines()) == 1, err


@pytest.mark.slow
def test_two_replicas_share_32_concurrent_streams(tmp_path):
    """`gpt-serve serve --ray` on a local Ray instance: 32 streams through Ray's proxy, all complete and both
    replicas serve some; a long stream's first chunk arrives at once (Ray's proxy streams); rows are freed when the
    clients leave; SIGTERM stops every process Ray started. Served on 127.0.0.1, no process Ray started listens on
    another address (its GCS, raylet, workers and agents too, not only Serve's proxy)."""
    pytest.importorskip("ray.serve")
    port, log = free_port(), tmp_path / "serve.log"
    command = [sys.executable, "-m", "gpt_serve", "serve", "--ray", "--replicas", "2", "--replica-cpus", "1"]
    command += ["--threads", "1", "--backend", "onnx-int8", "--port", str(port), "--log-level", "warning"]
    command += ["--max-tokens-limit", "100000"]  # the long streams below must outlast the checks made while they run
    env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}  # no usage report over the network
    with open(log, "wb") as out:
        server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    url, started = f"http://127.0.0.1:{port}", set()
    try:
        # ready once every replica is (Serve's proxy answers /health as soon as one is)
        ready = "2 Ray Serve replicas; Ctrl-C stops"
        assert wait_until(lambda: ready in log.read_text() or server.poll() is not None, timeout=180), log.read_text()
        assert server.poll() is None and _healthy(url), log.read_text()[-3000:]
        started = _descendants(server.pid)
        listening = _listening({server.pid, *started})
        exposed = [(pid, ip, port) for pid, ip, port in listening if ip not in LOOPBACK]
        assert listening and not exposed, [
            (Path(f"/proc/{pid}/cmdline").read_bytes()[:80], ip) for pid, ip, _ in exposed
        ]
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)

        def stream(i: int) -> tuple[str, str, int]:
            raw = client.completions.with_raw_response.create(
                model="shakespeare", prompt="ROMEO:", max_tokens=40 + i, seed=i, stream=True,
                stream_options={"include_usage": True},
            )  # fmt: skip
            chunks = list(raw.parse())
            return raw.headers["x-gpt-serve-replica"], "".join(c.choices[0].text for c in chunks[:-1]), chunks

        with ThreadPoolExecutor(32) as pool:
            results = list(pool.map(stream, range(32)))
        for i, (_, text, chunks) in enumerate(results):
            assert len(text) == 40 + i and chunks[-1].usage.completion_tokens == 40 + i
            assert chunks[-2].choices[0].finish_reason == "length"
        served = collections.Counter(replica for replica, _, _ in results)
        assert len(served) == 2 and sum(served.values()) == 32, served

        # Long streams (exact mode: a full-window forward per token past block_size) until both replicas have one:
        # Ray's proxy sends a request to the less busy replica, so only then does /metrics reach both.
        long = {"model": "shakespeare", "prompt": "A", "max_tokens": 100_000, "stream": True}  # a minute or more
        with httpx.Client(base_url=url, timeout=60) as http:
            rows = _RowsSeen(http)
            with contextlib.ExitStack() as streams:
                opened, lines = collections.Counter(), []  # (a dropped line iterator would close its stream)
                while len(opened) < 2 and len(lines) < 6:
                    start = time.monotonic()
                    response = streams.enter_context(http.stream("POST", "/v1/completions", json=long))
                    lines.append(response.iter_lines())
                    assert next(lines[-1]).startswith("data: ")
                    # streamed, not buffered: 100,000 tokens take minutes, the first chunk comes at once
                    assert time.monotonic() - start < 10
                    opened[response.headers["x-gpt-serve-replica"]] += 1
                assert len(opened) == 2, opened
            assert wait_until(lambda: rows.are(dict.fromkeys(opened, 0))), rows.seen  # the clients left: rows freed
        started |= _descendants(server.pid)
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert wait_until(lambda: not [p for p in started if _alive(p)], timeout=30), [p for p in started if _alive(p)]
    finally:  # after a failure: whatever is left of what this test started
        for pid in [*(started | _descendants(server.pid)), server.pid]:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        server.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


class _RowsSeen:
    """The last `gpt_serve_num_requests_running` seen from each replica (Ray's proxy picks the replica of each
    /metrics)."""

    def __init__(self, http: httpx.Client):
        self.http, self.seen = http, {}

    def are(self, expected) -> bool:
        answer = self.http.get("/metrics")
        line = next(x for x in answer.text.splitlines() if x.startswith("gpt_serve_num_requests_running{"))
        self.seen[answer.headers["x-gpt-serve-replica"]] = float(line.split()[-1])
        return self.seen == dict(expected)


def _descendants(pid: int) -> set[int]:
    """The processes below `pid` (Linux /proc), e.g. Ray's GCS, raylet and the replicas' workers."""
    children = collections.defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children[parent].append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children[todo.pop()]:
            found.add(child)
            todo.append(child)
    return found


LOOPBACK = ("127.0.0.1", "::1")


def _listening(pids: set[int]) -> list[tuple[int, str, int]]:
    """(pid, address, port) of each TCP socket that the processes `pids` listen on (Linux /proc)."""
    import ipaddress

    addresses = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            _, local, _, state, *rest = line.split()
            if state == "0A":  # LISTEN
                ip, port = local.split(":")
                raw = bytes.fromhex(ip)  # 32-bit words in host (little-endian) order
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                address = ipaddress.ip_address(raw)
                address = getattr(address, "ipv4_mapped", None) or address  # ::ffff:127.0.0.1 is 127.0.0.1
                addresses[rest[5]] = (str(address), int(port, 16))
    found = []
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:  # gone
            continue
        for fd in fds:
            try:
                link = os.readlink(fd)
            except OSError:  # closed meanwhile
                continue
            if link.startswith("socket:[") and link[8:-1] in addresses:
                found.append((pid, *addresses[link[8:-1]]))
    return found


def _alive(pid: int) -> bool:
    """Running (a zombie, already dead but not yet reaped, is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
