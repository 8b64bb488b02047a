"""`python -m training.ladder` on a short schedule, and the ladder models shipped inside the package."""

from __future__ import annotations

import json
import re

import pytest
import torch
from huggingface_hub import ModelCard

from gpt_serve import CharGPTForCausalLM, CharTokenizer
from gpt_serve.models import list_models, model_path
from training.data import CharDataset
from training.ladder import main, parse_stages, tiled_loss
from training.presets import LADDER_TOLERANCE, get_preset

SHIPPED = [f"ladder-{c}" for c in "abcde"]


def test_parse_stages():
    assert parse_stages("a-e") == SHIPPED
    assert parse_stages("E,a,ladder-c") == ["ladder-a", "ladder-c", "ladder-e"]
    assert parse_stages("f") == ["ladder-f"]
    with pytest.raises(ValueError, match="unknown ladder stage 'g'"):
        parse_stages("a,g")


def test_ladder_command_trains_stages_and_writes_table_plot_and_shipped_copies(tmp_path, small_data_path, capsys):
    argv = [
        "--stages",
        "a,d",
        "--data",
        str(small_data_path),
        "--out",
        str(tmp_path / "runs"),
        "--ship-dir",
        str(tmp_path / "models"),
        "--table",
        str(tmp_path / "docs" / "ladder.md"),
        "--plot",
        str(tmp_path / "docs" / "ladder.png"),
        "--max-iters",
        "20",
        "--eval-interval",
        "10",
        "--eval-iters",
        "2",
        "--no-progress",
    ]
    assert main(argv) == 0
    table = (tmp_path / "docs" / "ladder.md").read_text()
    assert "python -m training.ladder --stages a,d" in table
    assert "![validation loss of every stage](ladder.png)" in table
    rows = [line for line in table.splitlines() if re.match(r"\| [A-F] \|", line)]
    assert [r.split("|")[1].strip() for r in rows] == ["A", "D"]
    header = table[table.index("| stage") :].splitlines()[0]
    for column in ("what it adds", "parameters", "train loss", "val loss", "the lesson's val loss", "difference"):
        assert column in header
    runs = json.loads((tmp_path / "runs" / "ladder.json").read_text())
    for row in runs:
        model = CharGPTForCausalLM.from_pretrained(tmp_path / "models" / row["stage"])
        assert row["parameters"] == sum(p.numel() for p in model.parameters())
    assert f"{runs[1]['val_loss']:.4f} | 2.08 | {runs[1]['val_loss'] - 2.08:+.3f} | **no** |" in rows[1]
    assert (tmp_path / "docs" / "ladder.png").read_bytes()[:4] == b"\x89PNG"
    for name in ("ladder-a", "ladder-d"):
        shipped = tmp_path / "models" / name
        assert not (shipped / "checkpoints").exists()
        assert {"README.md", "loss.png", "metrics.jsonl", "model.safetensors", "config.json"} <= {
            p.name for p in shipped.iterdir()
        }
        card = (shipped / "README.md").read_text()
        assert f"python -m training --preset {name} --out {tmp_path / 'runs' / name}" in card  # the same run alone
    assert "| A |" in capsys.readouterr().out

    # What the exporter adds to a shipped folder survives shipping again.
    shipped = tmp_path / "models" / "ladder-a"
    (shipped / "onnx").mkdir()
    (shipped / "onnx" / "model.onnx").write_bytes(b"onnx")
    section = "<!-- gpt-serve:onnx:begin (by export) -->\n## ONNX\n<!-- gpt-serve:onnx:end -->"
    (shipped / "README.md").write_text((shipped / "README.md").read_text() + "\n" + section + "\n")
    weights = (shipped / "model.safetensors").read_bytes()

    # Run again: every stage is resumed from its final checkpoint, nothing is trained twice.
    before = (tmp_path / "runs" / "ladder-d" / "metrics.jsonl").read_text()
    assert main(argv) == 0
    assert (tmp_path / "runs" / "ladder-d" / "metrics.jsonl").read_text() == before
    assert (shipped / "model.safetensors").read_bytes() == weights  # the same weights, byte for byte
    assert (shipped / "onnx" / "model.onnx").read_bytes() == b"onnx"
    assert (shipped / "README.md").read_text().count(section) == 1


@pytest.fixture(scope="module")
def val_set(corpus, tokenizer):
    return CharDataset(corpus, tokenizer, block_size=8)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_ladder_model_is_within_tolerance_of_the_lesson(name, val_set, tokenizer):
    folder = model_path(name)
    assert name in list_models() and not (folder / "checkpoints").exists()
    model = CharGPTForCausalLM.from_pretrained(folder)
    lesson = get_preset(name).lesson_val_loss
    # Recomputed here over the whole validation split (no sampling noise), and as logged by the run.
    whole = tiled_loss(model, val_set, "val")
    logged = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()][-1]
    assert logged["step"] == 5000
    assert abs(whole - lesson) <= LADDER_TOLERANCE, (name, whole, lesson)
    assert abs(logged["val_loss"] - lesson) <= LADDER_TOLERANCE, (name, logged["val_loss"], lesson)
    card = ModelCard.load(folder / "README.md")
    assert card.data.library_name == "transformers" and card.data.datasets == ["karpathy/tiny_shakespeare"]
    assert card.data.eval_results[0].metric_value == round(logged["val_loss"], 4)
    assert f"python -m training --preset {name}" in card.text
    assert CharTokenizer.from_pretrained(folder).vocab.chars == tokenizer.vocab.chars


def test_tiled_loss_of_a_random_model_is_about_ln_vocab(val_set):
    torch.manual_seed(0)
    from gpt_serve import CharGPTConfig

    model = CharGPTForCausalLM(CharGPTConfig(vocab_size=65, **get_preset("ladder-a").model))
    assert tiled_loss(model, val_set, "val") == pytest.approx(4.17, abs=0.15)  # ln(65) = 4.17
