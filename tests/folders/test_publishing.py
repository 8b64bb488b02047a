"""gpt_serve.folders.publishing: where `gpt-serve copy` may write (the copy's files: tests/chargpt/
test_transformers_contract.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpt_serve.cli import main
from gpt_serve.models import model_path


@pytest.mark.parametrize("out", ["F/..", "F", "F/../.", "."])
def test_a_copy_over_the_folder_or_one_that_holds_it_is_refused_by_name(tmp_path, monkeypatch, capsys, out):
    """`gpt-serve copy X X/.. --force` printed a raw "[Errno 16] Device or resource busy" (and replacing the folder
    that holds the model would delete it): one line naming both, exit 2, nothing touched."""
    folder = Path(shutil.copytree(model_path("ladder-a"), tmp_path / "F"))
    monkeypatch.chdir(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["copy", "F", out, "--force"]) == 2
    err = capsys.readouterr().err
    where = "is the model folder" if Path(out).resolve() == folder else "holds the model folder"
    assert f"{out} {where} F: writing the copy there would replace the model being copied" in err, err
    assert "Errno" not in err and len(err.strip().splitlines()) == 1
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_copy_beside_the_folder_is_written(tmp_path, monkeypatch):
    shutil.copytree(model_path("ladder-a"), tmp_path / "F")
    monkeypatch.chdir(tmp_path)
    assert main(["copy", "F", "F-copy"]) == 0 and (tmp_path / "F-copy" / "model.safetensors").is_file()
