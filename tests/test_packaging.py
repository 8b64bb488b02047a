"""The wheel: only gpt_serve-prefixed names at the top of site-packages, living next to generic ones; and the
installs the docs promise, each in a fresh venv from a package index, with the installed `gpt-serve` command run as
a user meets it: the torch-free one (`numpy onnxruntime`, then the wheel `--no-deps`) and the `serve` extra's."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import venv
import zipfile
from pathlib import Path

import pytest

from demo.browser import PAGE_FILES

ROOT = Path(__file__).resolve().parents[1]
GENERIC = ("training", "export", "demo")


def dummy_wheel(folder: Path, name: str) -> Path:
    """A wheel of a one-module package `name` (what PyPI's `export` or any other generic name could be)."""
    dist = f"{name}-0.0.1.dist-info"
    path = folder / f"{name}-0.0.1-py3-none-any.whl"
    files = {
        f"{name}/__init__.py": f"DUMMY = {name!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as wheel:
        for arcname, text in files.items():
            wheel.writestr(arcname, text)
        wheel.writestr(f"{dist}/RECORD", "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n")
    return path


def pip(venv_python: Path, *args: str, timeout: float = 300) -> None:
    """The test environment's pip, acting on another environment (`pip --python`)."""
    cmd = [sys.executable, "-m", "pip", "--python", str(venv_python), "--disable-pip-version-check", "-q", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-2000:]


def run(venv_python: Path, code: str) -> str:
    result = subprocess.run([str(venv_python), "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy of the tracked files (an in-tree build would write build/ into the clone)."""
    out, source = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("source")
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in tracked.decode().split("\0"):
        if name and (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(source)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    (path,) = out.glob("gpt_serve-*.whl")
    return path


@pytest.mark.slow
def test_the_wheel_has_only_gpt_serve_names_at_the_top(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"gpt_serve", "gpt_serve_training", "gpt_serve_export", "gpt_serve_demo"}
    assert "gpt_serve/models/shakespeare/model.safetensors" in names  # the shipped models travel with it
    assert not [n for n in names if n.startswith("gpt_serve/models/") and n.endswith(".py") and "__init__" not in n]
    assert {f"gpt_serve_demo/web/{name}" for name in PAGE_FILES} <= set(names)  # the in-browser page's own files
    assert not [n for n in names if "node_modules" in n or n.endswith("package.json")]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        text = archive.read(entry_points).decode()
    assert "train = gpt_serve_training.cli:main" in text and "demo = gpt_serve_demo.cli:main" in text


@pytest.mark.slow
def test_the_wheel_and_generic_packages_do_not_clobber_each_other(wheel, tmp_path):
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    python = env / "bin" / "python"
    dummies = [dummy_wheel(tmp_path, name) for name in GENERIC]
    pip(python, "install", "--no-deps", "--no-index", str(wheel), *map(str, dummies))
    site = Path(run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])"))
    check = "import training, export, demo, gpt_serve; print(training.DUMMY, export.DUMMY, demo.DUMMY)"
    assert run(python, check) == "training export demo"  # the generic names are the other packages'
    assert run(python, "import gpt_serve; print(gpt_serve.__version__)")  # torch-free import, nothing else needed
    for name in ("gpt_serve_training/cli.py", "gpt_serve_export/cli.py", "gpt_serve_demo/cli.py"):
        assert (site / name).is_file(), name
    pip(python, "uninstall", "-y", "export")  # removing the generic package leaves ours whole
    assert (site / "gpt_serve_export" / "cli.py").is_file() and not (site / "export").exists()
    pip(python, "uninstall", "-y", "gpt-serve")  # and removing ours leaves theirs
    assert run(python, "import training, demo; print(training.DUMMY, demo.DUMMY)") == "training demo"
    assert not (site / "gpt_serve_training").exists()


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ([sys.executable, "-m", "training", "--list-presets"], "ladder-a"),
        ([sys.executable, "-m", "export", "--help"], "Export a CharGPT model folder to ONNX"),
        ([sys.executable, "-m", "demo", "--help"], "Launch the gpt-serve web demo"),
        ([str(Path(sys.executable).parent / "gpt-serve"), "train", "--list-presets"], "ladder-a"),
        ([str(Path(sys.executable).parent / "gpt-serve"), "export", "--help"], "Export a CharGPT model folder"),
        ([str(Path(sys.executable).parent / "gpt-serve"), "demo", "--help"], "Launch the gpt-serve web demo"),
        ([sys.executable, "-m", "demo.space", "--help"], "usage: gpt-serve space"),
        ([str(Path(sys.executable).parent / "gpt-serve"), "space", "--help"], "usage: gpt-serve space"),
    ],
    ids=[
        "python -m training",
        "python -m export",
        "python -m demo",
        "gpt-serve train",
        "gpt-serve export",
        "gpt-serve demo",
        "python -m demo.space",
        "gpt-serve space",
    ],
)
def test_the_applications_run_from_the_clone_and_as_gpt_serve_subcommands(command, expected):
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert expected in result.stdout


def new_venv(folder: Path, *installs: list[str], timeout: float = 300) -> Path:
    """A fresh venv at `folder` (no pip, no system site-packages) after each `pip install` of `installs`, pinned by
    constraints.txt (an unpinned torch would be a multi-GB CUDA build); its bin folder. Prints how long it took."""
    start = time.perf_counter()
    venv.create(folder, with_pip=False)
    for args in installs:
        pip(folder / "bin" / "python", "install", "-c", str(ROOT / "constraints.txt"), *args, timeout=timeout)
    print(f"\n{folder.name}: built in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return folder / "bin"


def gpt_serve(bin_dir: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """The venv's `gpt-serve` console script, run from an empty folder with nothing of this environment about it."""
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [str(bin_dir / "gpt-serve"), *args], cwd=bin_dir.parent, env=env, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip


def assert_one_line(result: subprocess.CompletedProcess, *expected: str) -> None:
    """A command that could not run: exit 2, one line on stderr holding each of `expected`, no traceback."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert len(result.stderr.splitlines()) == 1 and all(e in result.stderr for e in expected), result.stderr


@pytest.fixture(scope="module")
def torch_free(wheel, tmp_path_factory) -> Path:
    """docs/runtimes.md's torch-free install: `pip install numpy onnxruntime`, then the wheel with `--no-deps`."""
    folder = tmp_path_factory.mktemp("envs") / "torch-free"
    return new_venv(folder, ["numpy", "onnxruntime"], ["--no-deps", str(wheel)])


@pytest.fixture(scope="module")
def serve_only(wheel, tmp_path_factory) -> Path:
    """`pip install 'gpt-serve[serve]'`: the base dependencies (torch among them) and the API's, no demo, no Ray."""
    folder = tmp_path_factory.mktemp("envs") / "serve-only"
    return new_venv(folder, [f"{wheel}[serve]"], timeout=900)


@pytest.mark.slow
def test_the_torch_free_install_runs_the_onnx_backends(torch_free, capsys):
    from gpt_serve.cli import main

    listed = gpt_serve(torch_free, "models")
    assert listed.returncode == 0 and listed.stdout.split()[0] == "shakespeare", listed.stderr[-2000:]
    assert "ladder-e" in listed.stdout and "site-packages/gpt_serve/models/shakespeare" in listed.stdout
    for backend in ("onnx-int8", "onnx"):
        args = ["generate", "shakespeare", "--backend", backend, "--prompt", "ROMEO:", "--max-new-tokens", "40"]
        args += ["--seed", "0", "--threads", "1"]
        result = gpt_serve(torch_free, *args)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.startswith("ROMEO:") and len(result.stdout) == len("ROMEO:") + 40 + 1
        assert main(args) == 0  # the same text as from the clone, in the full environment
        assert capsys.readouterr().out == result.stdout, backend


@pytest.mark.slow
def test_the_torch_free_install_names_what_every_other_command_needs(torch_free):
    torch_backend = gpt_serve(torch_free, "generate", "--backend", "torch", "--prompt", "ROMEO:")
    assert_one_line(torch_backend, "the torch backend needs PyTorch and transformers", "'onnx' or 'onnx-int8'")
    extras = {
        ("serve",): "gpt-serve serve needs the 'serve' extra",
        ("serve", "--ray"): "pip install 'gpt-serve[ray]'",
        ("train", "--help"): "gpt-serve train needs the 'train' extra",
        ("ladder", "--help"): "gpt-serve ladder needs the 'train' extra",
        ("export", "--help"): "gpt-serve export needs the 'export' extra",
        ("import", "ckpt.pt", "out"): "gpt-serve import needs PyTorch and transformers",
        ("copy", "shakespeare", "out"): "gpt-serve copy needs PyTorch and transformers",
    }
    for args, expected in extras.items():
        assert_one_line(gpt_serve(torch_free, *args), expected, "pip install")
    with socket.socket() as s:  # the demo checks its port first: a free one
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    demo = gpt_serve(torch_free, "demo", "--port", port)
    assert demo.returncode == 2 and "Traceback" not in demo.stderr, demo.stderr[-3000:]
    assert "needs the 'demo' extra" in demo.stderr.splitlines()[-1], demo.stderr


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.mark.slow
def test_the_serve_extra_alone_serves_the_api(serve_only, tmp_path):
    from tests.helpers import wait_until

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"PATH": f"{serve_only}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), "OMP_NUM_THREADS": "1"}
    args = [str(serve_only / "gpt-serve"), "serve", "--port", str(port), "--threads", "1", "--log-level", "warning"]
    url, log = f"http://127.0.0.1:{port}", tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:  # torch and the model load, then a warm-up
        assert wait_until(lambda: server.poll() is not None or answers(url), timeout=180, interval=0.5)
        assert server.poll() is None, log.read_text()[-3000:]
        request = {"model": "shakespeare", "prompt": "ROMEO:", "max_tokens": 20, "seed": 0}
        answer = post(f"{url}/v1/completions", request)
        assert answer["object"] == "text_completion" and answer["usage"]["completion_tokens"] == 20, answer
        assert len(answer["choices"][0]["text"]) == 20
    finally:
        server.send_signal(signal.SIGTERM)  # a service manager's stop
        code = server.wait(timeout=60)
    assert code == -signal.SIGTERM, log.read_text()[-3000:]  # uvicorn's clean stop re-raises the signal
    ray = gpt_serve(serve_only, "serve", "--ray", "--port", str(port))
    assert_one_line(ray, "needs the 'ray' extra (cannot import ray): pip install 'gpt-serve[ray]'")
    demo = gpt_serve(serve_only, "demo", "--port", str(port))
    assert demo.returncode == 2 and "needs the 'demo' extra" in demo.stderr.splitlines()[-1], demo.stderr[-3000:]
    onnx = gpt_serve(serve_only, "generate", "--backend", "onnx", "--prompt", "ROMEO:")
    assert_one_line(onnx, "the onnx backend needs the 'onnx' extra (cannot import onnxruntime)")
