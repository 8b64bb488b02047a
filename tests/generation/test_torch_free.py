"""The ONNX Runtime path works where torch, transformers and onnx cannot be imported (nor the server's and the
demo's packages: `gpt-serve generate --backend onnx` needs numpy and onnxruntime alone)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from gpt_serve.generation.backends.torch_backend import TorchBackend
from gpt_serve.generation.inline import generate_tokens
from gpt_serve.generation.sampling import SamplingParams
from tests.conftest import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]  # the repository: its gpt_serve, not an installed one

SCRIPT = textwrap.dedent(
    """
    import json, sys

    BLOCKED = ("torch", "transformers", "onnx", "onnxscript", "safetensors") + ("anyio", "fastapi", "starlette",
               "uvicorn", "pydantic", "prometheus_client", "gradio", "ray")


    class BlockHeavyImports:  # a meta path finder: importing a blocked package fails, as if it were not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None


    sys.meta_path.insert(0, BlockHeavyImports())

    from gpt_serve.generation.inline import generate_tokens, stream_text
    from gpt_serve.generation.backends.onnx_backend import OnnxBackend
    from gpt_serve.generation.sampling import SamplingParams

    folder = sys.argv[1]
    backend = OnnxBackend(folder, threads=1)
    greedy = [t.tolist() for t in generate_tokens(backend, [[1, 2, 3], [9]], 40, SamplingParams(temperature=0))]
    int8 = OnnxBackend(folder, quantized=True, threads=1)
    text = "".join(stream_text(int8, int8.vocab, "ROMEO:", 20, SamplingParams(0.8), seed=3, window_mode="refill"))
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)

    import contextlib, io  # the CLI's default backend is torch: a message, not a traceback
    from gpt_serve.cli import main

    with contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(["generate", folder, "--max-new-tokens", "5"])
    print(json.dumps({"greedy": greedy, "text": text, "loaded": loaded, "torch_cli": [code, err.getvalue()]}))
    """
)


def run_script(text: str, folder, tmp_path, cwd, **env) -> dict:
    """Runs `text` as a script in a fresh interpreter with `folder` as its argument; its last line, as JSON."""
    script = tmp_path / "script.py"
    script.write_text(text, encoding="utf-8")
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", **env}
    proc = subprocess.run(
        [sys.executable, str(script), str(folder)], cwd=cwd, capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_onnx_runtime_path_never_imports_torch(exported_dir, tmp_path):
    result = run_script(SCRIPT, exported_dir, tmp_path, ROOT, PYTHONPATH=str(ROOT))
    assert result["loaded"] == []
    assert len(result["text"]) == 20
    expected = np.stack(
        list(generate_tokens(TorchBackend(make_tiny_model()), [[1, 2, 3], [9]], 40, SamplingParams(temperature=0)))
    )
    np.testing.assert_array_equal(np.array(result["greedy"]), expected)
    code, err = result["torch_cli"]
    assert code == 2 and "the torch backend needs PyTorch and transformers" in err, err
    assert "use the 'onnx' or 'onnx-int8' backend" in err and "Traceback" not in err


FULL_ENV_SCRIPT = textwrap.dedent(
    """
    import contextlib, io, json, sys

    from gpt_serve.cli import main
    from gpt_serve.generation import SamplingParams, generate_text, load_backend

    loaded = load_backend(sys.argv[1], "onnx-int8", threads=1)
    text = generate_text(loaded.backend, loaded.vocab, "ROMEO:", 20, SamplingParams(0.8), seed=3)
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = main(["generate", sys.argv[1], "--backend", "onnx", "--max-new-tokens", "10", "--threads", "1"])
    heavy = sorted({m.split(".")[0] for m in sys.modules} & {"torch", "transformers", "anyio", "fastapi", "gradio"})
    print(json.dumps({"text": text, "cli": [code, out.getvalue()], "loaded": heavy}))
    """
)


def test_the_onnx_path_stays_torch_free_where_torch_is_installed(exported_dir, tmp_path):
    """In the full environment (torch and transformers importable), neither is imported by the ONNX path, nor is a
    server's or the demo's package by `gpt-serve generate --backend onnx`."""
    result = run_script(FULL_ENV_SCRIPT, exported_dir, tmp_path, tmp_path, PYTHONPATH=str(ROOT))
    assert result["loaded"] == []
    assert len(result["text"]) == 20
    code, printed = result["cli"]
    assert code == 0 and len(printed) == 1 + 10  # the empty prompt, ten characters, the newline
