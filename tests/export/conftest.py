"""Fixtures of the export tests: a tiny model folder exported once per session (fp32 + int8), one thread each."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def copy_model_dir(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="session")
def exported(tmp_path_factory, tiny_model_dir, corpus):
    """(folder, report) of the tiny model (tests/conftest.py's `make_tiny_model()`) exported with validation."""
    from export.exporter import export_model

    folder = copy_model_dir(tiny_model_dir, tmp_path_factory.mktemp("exported") / "tiny")
    report = export_model(folder, text=corpus, text_source="tinyshakespeare.txt", threads=1, val_tokens=2048)
    return folder, report


@pytest.fixture(scope="session")
def exported_dir(exported) -> Path:
    return exported[0]
