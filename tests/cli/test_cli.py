"""The gpt-serve command as a whole: its version, no weight-loading bar, and a dependency that is not installed is
one line naming what to install (every command, its packages blocked)."""

import pytest

from gpt_serve.cli import main


def test_the_commands_print_no_weight_loading_bar(tiny_model_dir, capsys):
    assert main(["generate", str(tiny_model_dir), "--max-new-tokens", "3", "--seed", "0"]) == 0
    assert "Loading weights" not in capsys.readouterr().err


def test_version(capsys):
    import gpt_serve

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"gpt-serve {gpt_serve.__version__}"


# A fresh interpreter where the named top-level packages are not installed (importing one fails as it would there)
WITHOUT = """
import sys

BLOCKED = set(sys.argv[1].split(","))


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
from gpt_serve.cli import main

sys.exit(main(sys.argv[2:]))
"""
SERVER = "fastapi,starlette,uvicorn,anyio,prometheus_client"


CASES = {  # command: (packages not installed, the start of its one line)
    "serve --no-preload": (SERVER, "gpt-serve serve needs the 'serve' extra (cannot import "),
    "serve --ray": ("ray", "gpt-serve serve --ray: Ray Serve needs the 'ray' extra (cannot import ray): "),
    "generate ladder-a --backend torch": ("torch,transformers", "gpt-serve generate: the torch backend needs "),
    "generate ladder-a --backend onnx": ("onnxruntime", "gpt-serve generate: the onnx backend needs the 'onnx' extra"),
    "import ckpt.pt out": ("torch,transformers", "gpt-serve import needs PyTorch and transformers, "),
    "copy ladder-a out": ("torch,transformers", "gpt-serve copy needs PyTorch and transformers, "),
    "train --help": ("torch", "gpt-serve train needs the 'train' extra (cannot import torch): "),
    "ladder --help": ("torch", "gpt-serve ladder needs the 'train' extra (cannot import torch): "),
    "export --help": ("onnx,onnxscript", "gpt-serve export needs the 'export' extra (cannot import onnx): "),
    "demo --backend onnx-int8": ("gradio,torch", "gpt-serve demo needs the 'demo' extra (cannot import gradio): "),
    "space ladder-a out": ("torch,transformers", "gpt-serve space needs PyTorch and transformers, "),
}


@pytest.mark.parametrize("command", list(CASES))
def test_a_missing_dependency_is_one_line_naming_what_to_install(command):
    """Every command, run where a package it needs is not installed: exit 2 and one line saying what to install (the
    extra, or gpt-serve's own dependencies), never a traceback."""
    import socket
    import subprocess
    import sys

    from tests.conftest import ROOT, busy_port

    blocked, message = CASES[command]
    argv = command.split()
    with busy_port() as busy, socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        if argv[0] == "serve":  # had the import worked, the server would stop at the busy port, not run on
            argv += ["--port", str(busy)]
        elif argv[0] == "demo":  # the demo checks its port before it imports gradio
            argv += ["--port", str(free.getsockname()[1])]
        free.close()
        cmd = [sys.executable, "-c", WITHOUT, blocked, *argv]
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    last = result.stderr.splitlines()[-1]
    assert last.startswith(message) and "pip install" in last, result.stderr
    if argv[0] != "demo":  # (the demo says first that, torch missing, it has no attention view)
        assert len(result.stderr.splitlines()) == 1, result.stderr
