"""`gpt-serve space MODEL OUT` (also `python -m demo.space`): a folder that runs the demo as a Hugging Face Space
with the Gradio SDK, ONNX Runtime int8 and no torch.

The folder holds `README.md` (the Space's front matter: `sdk: gradio`, `sdk_version` the Gradio this runs, `app_file`,
a title and the model card's license, tags and datasets), `app.py` (the demo on the model, `onnx-int8`, listening
where `GRADIO_SERVER_NAME` / `GRADIO_SERVER_PORT` say, as Spaces set them), `requirements.txt` (the packages of the
ONNX Runtime path, the API and the demo, pinned to the versions installed here, and gpt-serve itself as a wheel in
the folder, declaring no dependencies of its own: pip would otherwise pull torch), the model (`gpt-serve copy`'s
folder, under `models/`), the in-browser page with onnxruntime-web's files (`web/`) and a `.gitattributes` that
keeps the binaries in Git LFS. Written whole or not at all. Publishing is the user's (docs/demo.md).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from gpt_serve.cli.flags import add_force_argument, add_progress_argument, quiet_model_loading, writer_parser
from gpt_serve.files import write_file, write_new_folder

from .browser import ORT_FILES, PAGE_FILES, WEB_DIR, browser_files, missing_files, problem

SOURCE = Path(__file__).resolve().parents[1]  # a clone's root (the wheel is built from it)
# What the Space installs: the ONNX Runtime path, the OpenAI-compatible API and the demo, without torch
SPACE_PACKAGES = ("numpy", "onnxruntime", "gradio", "fastapi", "uvicorn", "prometheus_client")
BACKEND = "onnx-int8"
LFS_PATTERNS = ("*.whl", "*.onnx", "*.safetensors", "*.wasm", "*.png")
APP = '''"""{title}: gpt-serve's demo as a Hugging Face Space (written by `gpt-serve space`).

Locally: `pip install -r requirements.txt && python app.py` (http://127.0.0.1:7860; GRADIO_SERVER_NAME and
GRADIO_SERVER_PORT choose another address, as a Space sets them).
"""

import sys
from pathlib import Path

from gpt_serve_demo.cli import main

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    sys.exit(main([str(HERE / "models" / {name}), "--backend", {backend}, "--web-dir", str(HERE / "web")]))
'''


def installed_version(package: str) -> str:
    """The version of `package` installed here (what the Space pins); a ValueError naming the extra otherwise."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        raise ValueError(f"{package} is not installed here: pip install 'gpt-serve[demo]'") from None


def requirements(wheel: str) -> str:
    lines = [f"{package}=={installed_version(package)}" for package in SPACE_PACKAGES]
    return "\n".join([f"./{wheel}", *lines]) + "\n"


def front_matter(title: str, card: dict) -> str:
    """The Space's README front matter: the SDK, the app, and the model card's license, tags and datasets."""
    import yaml  # PyYAML, with transformers (huggingface_hub)

    fields = {
        "title": title, "emoji": "🎭", "colorFrom": "indigo", "colorTo": "gray", "sdk": "gradio",
        "sdk_version": installed_version("gradio"), "python_version": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "app_file": "app.py", "pinned": False,
    }  # fmt: skip
    fields.update({key: card[key] for key in ("license", "tags", "datasets") if card.get(key)})
    return f"---\n{yaml.safe_dump(fields, sort_keys=False, allow_unicode=True)}---\n"


def card_fields(card_text: str) -> dict:
    """A model card's front matter (YAML between `---` lines) as a dict; {} without one."""
    import yaml

    match = re.match(r"---\n(.*?)\n---\n", card_text, re.S)
    fields = yaml.safe_load(match.group(1)) if match else None
    return fields if isinstance(fields, dict) else {}


def readme(title: str, name: str, card_text: str) -> str:
    body = f"""
# {title}

The character-level GPT `{name}` in gpt-serve's Gradio demo, on ONNX Runtime (int8, no torch), with its
OpenAI-compatible API at `/v1` and the in-browser page at `/browser/`. The model and its card: `models/{name}/`.

Run it here: `pip install -r requirements.txt && python app.py`, then open http://127.0.0.1:7860.
Publish it as a Space: `huggingface-cli upload USER/SPACE . --repo-type space` from this folder, or `git push` to
the Space's repository with Git LFS (`.gitattributes` lists the binary files).
"""
    return front_matter(title, card_fields(card_text)) + body


def check_clone() -> None:
    """A ValueError unless this demo runs from a clone (an installed wheel has no source to build gpt-serve from)."""
    if not (SOURCE / "pyproject.toml").is_file():
        raise ValueError(
            f"gpt-serve space builds gpt-serve's wheel from a clone (git clone, then make install): {SOURCE} has no "
            "pyproject.toml"
        )


def build_wheel(out: Path) -> str:
    """gpt-serve's wheel, built into `out` from this clone without the shipped models and without dependencies
    (requirements.txt lists them); returns its file name."""
    check_clone()
    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp) / "gpt-serve"
        skip = shutil.ignore_patterns("__pycache__", "node_modules", "*.pyc")
        for entry in ("gpt_serve", "training", "export", "demo"):
            shutil.copytree(SOURCE / entry, stage / entry, ignore=skip, symlinks=True)
        for folder in (stage / "gpt_serve" / "models").iterdir():  # the Space carries its own model
            if folder.is_dir():
                shutil.rmtree(folder)
        for link in (stage / "demo" / "web" / "model", stage / "demo" / "web" / "ort"):
            link.unlink(missing_ok=True)
        shutil.copy(SOURCE / "README.md", stage)
        pyproject = (SOURCE / "pyproject.toml").read_text(encoding="utf-8")
        pyproject, found = re.subn(r"(?ms)^dependencies = \[.*?^\]", "dependencies = []", pyproject, count=1)
        assert found, "pyproject.toml's [project] dependencies not found"
        (stage / "pyproject.toml").write_text(pyproject, encoding="utf-8")
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out)]
        done = subprocess.run([*command, str(stage)], capture_output=True, text=True)
        if done.returncode != 0:
            raise ValueError(f"building gpt-serve's wheel failed: {done.stderr.strip()[-2000:]}")
    (wheel,) = [p.name for p in out.glob("gpt_serve-*.whl")]
    return wheel


def write_web(out: Path, model: Path) -> None:
    """The in-browser page's files and onnxruntime-web's (real files, not links into node_modules)."""
    files = browser_files(model, WEB_DIR)
    wrong = problem(missing_files(files), WEB_DIR, model)
    if wrong:
        raise ValueError(f"the in-browser page cannot be carried: {wrong}")
    (out / "ort").mkdir(parents=True)
    for name in (*PAGE_FILES, *(f"ort/{n}" for n in ORT_FILES)):
        shutil.copyfile(files[name], out / name)


def write_space(model: str, out: str | Path, title: str | None = None, replace: bool = False) -> Path:
    """Writes the Space's folder `out` for `model` (a shipped name or a model folder); returns `out`."""
    from gpt_serve.folders.publishing import write_self_contained
    from gpt_serve.models import model_path
    from gpt_serve.onnx_contract import onnx_path

    check_clone()
    source = model_path(model)
    name = source.resolve().name
    if not onnx_path(source, quantized=True).is_file():
        raise ValueError(f"{source} has no int8 ONNX graph, which the Space runs: python -m export {source}")
    title = title or f"gpt-serve: {name}"

    def write(tmp: Path) -> None:
        write_self_contained(source, tmp / "models" / name)
        write_web(tmp / "web", source)
        wheel = build_wheel(tmp)
        card_file = tmp / "models" / name / "README.md"
        card = card_file.read_text(encoding="utf-8") if card_file.is_file() else ""
        write_file(tmp / "README.md", readme(title, name, card))
        in_docstring = title.replace("\\", "/").replace('"', "'")
        app = APP.format(title=in_docstring, name=json.dumps(name), backend=json.dumps(BACKEND))
        write_file(tmp / "app.py", app)
        write_file(tmp / "requirements.txt", requirements(wheel))
        write_file(tmp / ".gitattributes", "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS))

    return write_new_folder(out, write, replace=replace)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpt-serve")
    sub = parser.add_subparsers(dest="command", required=True)
    s = writer_parser(
        sub, "space", "model", "shipped model name or model folder (with its int8 ONNX export)", "the Space's folder",
        HELP, DESCRIPTION,
    )  # fmt: skip
    s.add_argument("--title", default=None, help="the Space's title (default: 'gpt-serve: MODEL')")
    add_force_argument(s)
    add_progress_argument(s)
    return parser


HELP = "write a folder that runs the demo as a Hugging Face Space (Gradio SDK, ONNX Runtime, no torch)"
DESCRIPTION = (
    "Write OUT, a folder that runs the demo on MODEL as a Hugging Face Space with the Gradio SDK: README.md with the "
    "Space's front matter, app.py, requirements.txt (gpt-serve as a wheel in the folder, ONNX Runtime, no torch), the "
    "model and the in-browser page. Publish it with `huggingface-cli upload USER/SPACE OUT --repo-type space`. Built "
    "from a clone; written whole or not at all."
)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(["space", *(sys.argv[1:] if argv is None else argv)])
    quiet_model_loading(args.progress)
    try:
        out = write_space(args.model, args.out, args.title, replace=args.force)
    except (ValueError, OSError) as e:
        print(f"gpt-serve space: error: {e}", file=sys.stderr)
        return 2
    print(f"gpt-serve space: wrote {out}: `cd {out} && pip install -r requirements.txt && python app.py` runs it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
