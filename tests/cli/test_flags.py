"""Every command spells its shared flags alike (progress, threads, seeds), and loading a model prints nothing."""

from __future__ import annotations

import argparse

import pytest


def _parsers() -> dict[str, argparse.ArgumentParser]:
    from demo.cli import build_parser as demo_parser
    from export.cli import build_parser as export_parser
    from gpt_serve.cli import build_parser as gpt_serve_parser
    from training.cli import build_parser as training_parser
    from training.ladder import build_parser as ladder_parser

    parsers = {"python -m training": training_parser(), "python -m training.ladder": ladder_parser()}
    parsers.update({"python -m export": export_parser(), "python -m demo": demo_parser()})
    root = gpt_serve_parser(apps={})
    sub = next(a for a in root._actions if isinstance(a, argparse._SubParsersAction))
    parsers.update({f"gpt-serve {name}": p for name, p in sub.choices.items()})
    return parsers


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


# what a flag about each thing must be called, wherever a command has one
SPELLINGS = {"progress": {"--progress", "--no-progress"}, "thread": {"--threads"}, "seed": {"--seed"}}


@pytest.mark.parametrize("command", sorted(_parsers()))
def test_progress_threads_and_seeds_have_one_spelling(command):
    options = _options(_parsers()[command])
    for word, spelled in SPELLINGS.items():
        about = {o for o in options if word in o}
        assert about <= spelled, f"{command}: {sorted(about - spelled)} should be spelled {sorted(spelled)}"
    if command not in ("gpt-serve models", "gpt-serve record-vocab"):  # the others load or train a model
        assert SPELLINGS["progress"] <= options, command


def test_training_takes_no_progress_and_still_its_old_spelling():
    from training.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["--no-progress"]).progress is False
    assert parser.parse_args(["--progress", "false"]).progress is False
    assert parser.parse_args(["--progress"]).progress is True
    assert parser.parse_args([]).progress is None  # the preset's (a bar)
    assert parser.parse_args(["--no-keep-best"]).keep_best is False


def test_ladder_takes_no_progress_and_checks_threads(capsys):
    from training.ladder import build_parser

    assert build_parser().parse_args(["--no-progress"]).progress is False
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--threads", "0"])
    assert "--threads: must be" in capsys.readouterr().err


def test_loading_a_model_prints_nothing(tiny_model_dir, capfd, monkeypatch):
    from transformers.utils import logging as transformers_logging

    from gpt_serve.generation import load_backend

    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    # transformers' default, a bar for every load (the commands' `main` switches it off for the whole process)
    monkeypatch.setattr(transformers_logging, "_tqdm_active", True)
    assert transformers_logging.is_progress_bar_enabled()
    load_backend(tiny_model_dir, "torch", threads=1)
    assert capfd.readouterr().err == ""
    assert transformers_logging.is_progress_bar_enabled()  # the caller's setting is left as it was
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "0")  # what --progress sets
    load_backend(tiny_model_dir, "torch", threads=1)
    assert "Loading weights" in capfd.readouterr().err


def test_the_readmes_transformers_snippet_prints_no_loading_bar(tiny_model_dir, tmp_path):
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import gpt_serve
        from transformers import AutoModelForCausalLM, pipeline

        gpt_serve.register_auto_classes()
        model = AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r})
        generator = pipeline("text-generation", model={str(tiny_model_dir)!r})
        print(generator("JULIET:", max_new_tokens=5)[0]["generated_text"])
    """)
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    env.update(HF_HOME=str(tmp_path / "hf"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Loading weights" not in result.stderr, result.stderr[-2000:]
