"""`gpt-serve space MODEL OUT`: the folder a Hugging Face Space runs, checked as a Space runs it: its
requirements installed into a fresh venv (pip, with the project's constraints, from the package index this machine
has), `python app.py` with GRADIO_SERVER_NAME / GRADIO_SERVER_PORT, a generation through `gradio_client`."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
import yaml

from demo.space import main, write_space
from tests.conftest import ROOT
from tests.helpers import free_port, wait_until


def front_matter(readme: str) -> dict:
    assert readme.startswith("---\n")
    return yaml.safe_load(readme.split("---\n")[1])


def test_the_folder_holds_what_a_gradio_space_runs(tmp_path):
    import gradio

    out = write_space("ladder-a", tmp_path / "space")
    fields = front_matter((out / "README.md").read_text(encoding="utf-8"))
    assert fields["sdk"] == "gradio" and fields["sdk_version"] == gradio.__version__ and fields["app_file"] == "app.py"
    assert fields["title"] == "gpt-serve: ladder-a" and fields["license"] == "mit"  # the model card's
    assert "character-level" in fields["tags"] and fields["datasets"] == ["karpathy/tiny_shakespeare"]
    lines = (out / "requirements.txt").read_text().splitlines()
    (wheel,) = [line for line in lines if line.endswith(".whl")]
    assert (out / wheel).is_file() and f"gradio=={gradio.__version__}" in lines
    assert not any(line.startswith(("torch", "transformers", "matplotlib")) for line in lines)
    assert (out / "models" / "ladder-a" / "onnx" / "model_quantized.onnx").is_file()
    for name in ("index.html", "app.js", "ort/ort.wasm.min.mjs", "ort/ort-wasm-simd-threaded.wasm"):
        assert (out / "web" / name).is_file() and not (out / "web" / name).is_symlink(), name
    assert "*.whl filter=lfs" in (out / ".gitattributes").read_text()


def test_bad_arguments_are_errors_that_write_nothing(tmp_path, tiny_model_dir, capsys):
    assert main(["runs/my-modle", str(tmp_path / "a")]) == 2
    assert "the model folder 'runs/my-modle' does not exist" in capsys.readouterr().err
    assert main([str(tiny_model_dir), str(tmp_path / "b")]) == 2  # not exported
    assert "has no int8 ONNX graph, which the Space runs: python -m export" in capsys.readouterr().err
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "file").write_text("x")
    assert main(["ladder-a", str(tmp_path / "c")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]


@pytest.mark.slow
def test_a_space_installs_from_scratch_and_generates_without_torch(exported_dir, tmp_path):
    from gradio_client import Client

    out = write_space(exported_dir, tmp_path / "space")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "-c", str(ROOT / "constraints.txt"), "-r", "requirements.txt"]
    installed = subprocess.run(pip, cwd=out, capture_output=True, text=True, timeout=900)
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode != 0
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port)}
    env["GRADIO_ANALYTICS_ENABLED"] = "False"
    with open(tmp_path / "app.log", "wb") as log:
        app = subprocess.Popen([str(python), "app.py"], cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until(lambda: _answers(url) or app.poll() is not None, 180), (tmp_path / "app.log").read_text()
        assert app.poll() is None, (tmp_path / "app.log").read_text()
        client = Client(url + "/", verbose=False)
        text = client.predict(prompt="ROMEO:", max_new_tokens=20, temperature=0, seed=0, api_name="/generate")
        assert isinstance(text, str) and len(text) == 20  # characters: one a token
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == "tiny"
        assert httpx.get(f"{url}/browser/ort/ort.wasm.min.mjs").status_code == 200
    finally:
        app.terminate()
        app.wait(timeout=60)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url + "/", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False
