"""The wheel: only gpt_serve-prefixed names at the top of site-packages, living next to generic ones."""

from __future__ import annotations

import shutil
import subprocess
import sys
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


def pip(venv_python: Path, *args: str) -> None:
    """The test environment's pip, acting on another environment (`pip --python`)."""
    cmd = [sys.executable, "-m", "pip", "--python", str(venv_python), "--disable-pip-version-check", "-q", *args]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
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
    ],
    ids=[
        "python -m training",
        "python -m export",
        "python -m demo",
        "gpt-serve train",
        "gpt-serve export",
        "gpt-serve demo",
    ],
)
def test_the_applications_run_from_the_clone_and_as_gpt_serve_subcommands(command, expected):
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert expected in result.stdout
