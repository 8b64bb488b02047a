"""The ONNX Runtime path works where torch, transformers and onnx cannot be imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

from gpt_serve.engine import generate_tokens
from gpt_serve.sampling import SamplingParams
from gpt_serve.torch_backend import TorchBackend
from tests.conftest import make_tiny_model

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, sys

    BLOCKED = ("torch", "transformers", "onnx", "onnxscript", "safetensors")


    class BlockHeavyImports:  # a meta path finder: importing a blocked package fails, as if it were not installed
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked in this test")
            return None


    sys.meta_path.insert(0, BlockHeavyImports())

    from gpt_serve.engine import generate_tokens, stream_text
    from gpt_serve.onnx_backend import OnnxBackend
    from gpt_serve.sampling import SamplingParams

    folder = sys.argv[1]
    backend = OnnxBackend(folder, threads=1)
    greedy = [t.tolist() for t in generate_tokens(backend, [[1, 2, 3], [9]], 40, SamplingParams(temperature=0))]
    int8 = OnnxBackend(folder, quantized=True, threads=1)
    text = "".join(stream_text(int8, int8.vocab, "ROMEO:", 20, temperature=0.8, seed=3, window_mode="refill"))
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print(json.dumps({"greedy": greedy, "text": text, "loaded": loaded}))
    """
)


def test_onnx_runtime_path_never_imports_torch(exported_dir, tmp_path):
    script = tmp_path / "torch_free.py"
    script.write_text(SCRIPT, encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, str(script), str(exported_dir)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    assert len(result["text"]) == 20
    expected = np.stack(
        list(generate_tokens(TorchBackend(make_tiny_model()), [[1, 2, 3], [9]], 40, SamplingParams(temperature=0)))
    )
    np.testing.assert_array_equal(np.array(result["greedy"]), expected)
