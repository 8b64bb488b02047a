"""The exporter: graph layout and metadata, self-validation (and that it can fail), the CLI and the model card."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from export.cli import main
from export.exporter import export_model
from export.onnx_export import OPSET, export_fp32
from export.report import CARD_BEGIN, CARD_END, card_section, update_model_card
from export.validate import compare_with_torch
from gpt_serve.chargpt.vocab import CharVocab
from gpt_serve.generation.backends.onnx_session import load_session, weights_sha256
from gpt_serve.onnx_contract import cache_names, onnx_path, past_names, present_names
from tests.conftest import make_tiny_model


def test_export_of_tiny_model_passes_its_own_validation(exported):
    folder, report = exported
    assert report.passed, report.failures
    assert report.installed
    assert report.checker == {"fp32": "ok", "int8": "ok", "fp32 in-place": "ok", "int8 in-place": "ok"}
    inplace = report.parity["fp32 in-place"]
    assert inplace.names_ok and not inplace.shape_errors and inplace.decode_steps == 4
    assert inplace.max_abs_logits <= 1e-4 and inplace.max_abs_cache <= 1e-4
    assert report.int8_inplace_vs_int8 <= 1e-4  # the same int8 weights as the checked int8 file
    fp32 = report.parity["fp32"]
    assert fp32.names_ok and not fp32.shape_errors
    assert fp32.batch_lengths == [12, 6, 1]  # left-padded rows
    assert fp32.decode_steps == 4
    assert fp32.max_abs_logits <= 1e-4 and fp32.max_abs_cache <= 1e-4
    assert report.val_loss is not None and report.val_loss.tokens >= 2000
    assert abs(report.val_loss.increase) < 0.05  # a random tiny model: int8 changes almost nothing
    for quantized in (False, True):
        assert onnx_path(folder, quantized).is_file() and onnx_path(folder, quantized, inplace=True).is_file()
    assert set(report.files) == {
        "onnx/model.onnx",
        "onnx/model_quantized.onnx",
        "onnx/decoder_inplace.onnx",
        "onnx/decoder_inplace_quantized.onnx",
    }
    assert report.files["onnx/model_quantized.onnx"] < report.files["onnx/model.onnx"]
    assert not [p for p in folder.iterdir() if p.name.startswith(".onnx-export-")]  # no work folder left


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]


def _io(proto: onnx.ModelProto) -> tuple[dict[str, list], dict[str, list]]:
    """The graph's inputs and outputs, in order, with their dims."""
    return {i.name: _dims(i) for i in proto.graph.input}, {o.name: _dims(o) for o in proto.graph.output}


def _metadata(proto: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in proto.metadata_props}


@pytest.mark.parametrize("quantized", [False, True])
def test_graph_io_names_dims_opset_and_metadata(exported_dir, quantized):
    proto = onnx.load(str(onnx_path(exported_dir, quantized)), load_external_data=False)
    config = make_tiny_model().config
    H, hs = config.n_head, config.head_size
    inputs, outputs = _io(proto)
    assert list(inputs) == ["input_ids", "attention_mask", "position_ids", *past_names(2)]
    assert list(outputs) == ["logits", *present_names(2)]
    assert inputs["input_ids"] == inputs["position_ids"] == ["batch_size", "sequence_length"]
    assert inputs["attention_mask"] == ["batch_size", "past_sequence_length + sequence_length"]
    assert inputs["past_key_values.1.value"] == ["batch_size", H, "past_sequence_length", hs]
    assert outputs["logits"] == ["batch_size", "sequence_length", 65]
    assert outputs["present.0.key"] == ["batch_size", H, "past_sequence_length + sequence_length", hs]
    assert {o.domain: o.version for o in proto.opset_import}[""] == OPSET == 17
    meta = _metadata(proto)
    vocab = CharVocab.from_file(exported_dir / "vocab.json")
    assert meta["block_size"] == "16" and meta["vocab_size"] == "65"
    assert meta["vocab_sha256"] == vocab.sha256
    assert meta["exporter_version"].startswith("gpt_serve.export ")
    assert meta["weights"] == ("int8" if quantized else "fp32")
    assert meta["weights_sha256"] == weights_sha256(exported_dir) and len(meta["weights_sha256"]) == 64


@pytest.mark.parametrize("quantized", [False, True])
def test_the_inplace_graph_reads_and_writes_the_cache_in_place(exported_dir, quantized):
    """The cache goes straight into ONNX Runtime's GroupQueryAttention (one node a layer, which writes the new
    columns in place when `present.*` is bound to `cache.*`); the metadata is the main graph's but for the format."""
    path = onnx_path(exported_dir, quantized, inplace=True)
    proto = onnx.load(str(path))
    config = make_tiny_model().config
    H, hs = config.n_head, config.head_size
    inputs, outputs = _io(proto)
    assert list(inputs) == ["input_ids", "position_ids", "cache_lengths", *cache_names(2)]
    assert list(outputs) == ["logits", *present_names(2)]
    assert inputs["cache.1.value"] == outputs["present.1.value"] == ["batch_size", H, "cache_columns", hs]
    assert inputs["input_ids"] == inputs["position_ids"] == ["batch_size", "sequence_length"]
    assert outputs["logits"] == ["batch_size", 65]  # each row's last token
    readers = {i: node.op_type for node in proto.graph.node for i in node.input}
    assert {readers[name] for name in cache_names(2)} == {"GroupQueryAttention"}  # read in place, never copied
    meta, main_meta = _metadata(proto), _metadata(onnx.load(str(onnx_path(exported_dir, quantized))))
    assert meta.pop("format") == "chargpt-decoder-inplace" and main_meta.pop("format") == "chargpt-decoder-with-past"
    assert meta == main_meta


def test_attention_exports_as_plain_nodes_with_a_constant_scale(exported_dir, tiny_model_dir, tmp_path):
    ops = [node.op_type for node in onnx.load(str(onnx_path(exported_dir))).graph.node]
    assert "Sqrt" not in ops  # no runtime-derived attention scale
    assert ops.count("Softmax") == 2  # one per layer of the tiny model
    from gpt_serve import CharGPTForCausalLM

    model = CharGPTForCausalLM.from_pretrained(tiny_model_dir)
    export_fp32(model, tmp_path / "again.onnx", {})
    assert model.config._attn_implementation == "sdpa"  # the export's eager attention is switched off again


def test_head_reshapes_have_static_targets(exported_dir):
    graph = onnx.load(str(onnx_path(exported_dir))).graph
    initializers = {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer}
    reshapes = [node for node in graph.node if node.op_type == "Reshape"]
    assert len(reshapes) == 4 * 2  # q, k, v split and the merge, per layer (the tiny model has 2)
    targets = sorted({tuple(initializers[node.input[1]].tolist()) for node in reshapes})
    assert targets == [(0, 0, 4, 8), (0, 0, 32)]  # n_head, head_size; n_embd
    assert sum(node.op_type == "Shape" for node in graph.node) <= 2  # only the mask's, once per graph


def test_validation_catches_a_graph_that_differs_from_the_model(exported_dir):
    session = load_session(onnx_path(exported_dir), threads=1)
    same = compare_with_torch(make_tiny_model(seed=0), session)
    other = compare_with_torch(make_tiny_model(seed=1), session)  # same architecture, other weights
    assert same.max_abs_logits <= 1e-4
    assert other.names_ok and not other.shape_errors
    assert other.max_abs_logits > 1e-2


@pytest.mark.parametrize(
    "overrides",
    [
        dict(n_head=1, n_layer=1, attn_proj=False, ffwd_mult=0, residual=False, layer_norm=False),  # ladder A
        dict(n_layer=1, ffwd_mult=1, ffwd_proj=False, residual=False, layer_norm=False, bias=False),  # ladder C
        dict(block_size=8, n_layer=3, init="pytorch"),  # ladder E's shape, a short window
        # every switch the importer uses off its default: nanoGPT's GELU, biases, tied embeddings, and C**-0.5
        dict(activation="gelu", bias=False, qkv_bias=True, tie_word_embeddings=True, attn_scale="n_embd"),
    ],
    ids=["ladder-a", "ladder-c", "block-8", "switches"],
)
def test_export_validates_every_ladder_variant(tmp_path, tokenizer, corpus, overrides):
    folder = tmp_path / "model"
    make_tiny_model(seed=3, **overrides).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    report = export_model(folder, text=corpus, threads=1, val_tokens=1024)
    assert report.passed, report.failures
    assert report.parity["fp32"].max_abs_logits <= 1e-4


def test_fp32_only_export(tmp_path, tiny_model_dir):
    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    report = export_model(folder, quantize=False, threads=1)
    assert report.passed and report.val_loss is None and "int8" not in report.parity
    assert onnx_path(folder).is_file() and not onnx_path(folder, quantized=True).exists()
    with pytest.raises(ValueError, match="validation text"):
        export_model(folder, quantize=True)


def test_cli_exports_prints_report_and_writes_model_card(tmp_path, tiny_model_dir, data_path, capfd):
    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    (folder / "README.md").write_text("# My model\n\nTrained on Shakespeare.\n", encoding="utf-8")
    argv = [str(folder), "--data", str(data_path), "--threads", "1", "--val-tokens", "1024"]
    assert main(argv) == 0
    out, err = capfd.readouterr()  # (the C++ side's stderr too)
    assert "PASS" in out and "max |Δlogits|" in out and "int8 val loss" in out
    assert "GroupQueryAttention" not in err  # torch's expected warning per in-place attention node: kept out
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert card.startswith("# My model\n\nTrained on Shakespeare.\n")
    assert card.count(CARD_BEGIN) == 1 and card.count(CARD_END) == 1
    assert "onnx/model_quantized.onnx" in card and "python -m export" in card
    digest = hashlib.sha256((folder / "onnx" / "model.onnx").read_bytes()).hexdigest()
    assert f"| `{digest[:16]}` |" in card and " s, " not in card  # a content hash, no time

    first = folder_bytes(folder)
    assert main(argv) == 0  # a second export replaces the section instead of appending another
    card = (folder / "README.md").read_text(encoding="utf-8")
    assert card.count(CARD_BEGIN) == 1 and card.startswith("# My model\n\nTrained on Shakespeare.\n")
    again = folder_bytes(folder)
    assert sorted(again) == sorted(first) and [p for p in first if first[p] != again[p]] == []  # byte for byte


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_two_processes_export_the_same_bytes(tmp_path, tiny_model_dir, data_path):
    """The same folder exported afresh in two processes (other hash seeds, other thread counts) gives the same
    files: the graphs, their int8 copies, genai's files and the model card."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    folder, runs = tmp_path / "m", []
    for seed, threads in (("1", "1"), ("2", "2")):
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(tiny_model_dir, folder)
        argv = [sys.executable, "-m", "export", str(folder), "--data", str(data_path), "--val-tokens", "1024"]
        env = {**os.environ, "PYTHONHASHSEED": seed, "OMP_NUM_THREADS": threads}
        result = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        runs.append(folder_bytes(folder))
    assert sorted(runs[0]) == sorted(runs[1]) and [p for p in runs[0] if runs[0][p] != runs[1][p]] == []


def test_cli_fails_above_the_int8_threshold_and_writes_nothing(tmp_path, tiny_model_dir, data_path, capsys):
    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    # Any int8 change (even an improvement smaller than 1 nat) exceeds a limit of -1.
    argv = [
        str(folder),
        "--data",
        str(data_path),
        "--threads",
        "1",
        "--val-tokens",
        "1024",
        "--max-int8-loss-increase",
        "-1",
    ]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "int8 raises the validation loss" in out
    assert not (folder / "onnx").exists()
    assert not (folder / "README.md").exists()
    assert not [p for p in folder.iterdir() if p.name.startswith(".onnx-export-")]


def test_cli_usage_errors(tmp_path, tiny_model_dir, capsys):
    assert main([str(tmp_path / "missing"), "--no-quantize"]) == 2
    assert f"the model folder '{tmp_path / 'missing'}' does not exist" in capsys.readouterr().err
    assert main([str(tmp_path)]) == 2  # named before the validation text is looked for (no download attempt)
    assert f"{tmp_path} is a folder but not a model folder: it has no config.json" in capsys.readouterr().err
    assert main([str(tiny_model_dir), "--data", str(tmp_path / "nope.txt")]) == 2
    assert "--data" in capsys.readouterr().err
    assert main(["--decode-steps", "0"]) == 2
    assert main([str(tiny_model_dir), "--no-quantize", "--decode-steps", "200"]) == 2  # block_size 16
    assert "decode_steps must be an integer in [1, block_size - 1] = [1, 15]" in capsys.readouterr().err


def test_an_interrupted_exports_work_folder_is_removed_by_the_next(tmp_path, tiny_model_dir):
    import shutil

    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "m"))
    stale = folder / ".onnx-export-killed"
    stale.mkdir()
    (stale / "model.onnx").write_bytes(b"half a graph")
    assert export_model(folder, quantize=False, threads=1).passed
    assert not stale.exists()


def test_model_card_update_keeps_the_rest(tmp_path, exported):
    _, report = exported
    readme = tmp_path / "README.md"
    readme.write_text("# Title\n\nIntro.\n\n## Training\n\nDetails.\n", encoding="utf-8")
    update_model_card(tmp_path, card_section(report, "python -m export X"))
    first = readme.read_text(encoding="utf-8")
    readme.write_text(first + "\n## Later section\n\nKept.\n", encoding="utf-8")
    update_model_card(tmp_path, card_section(report, "python -m export Y"))
    text = readme.read_text(encoding="utf-8")
    assert text.startswith("# Title\n\nIntro.\n\n## Training\n\nDetails.\n")
    assert text.count("## ONNX") == 1 and "python -m export Y" in text and "python -m export X" not in text
    assert text.rstrip().endswith("## Later section\n\nKept.")
    assert np.isfinite(report.val_loss.int8)


@pytest.mark.parametrize("link", ["README.md", "onnx"])
def test_the_export_never_writes_through_a_link(tmp_path, tiny_model_dir, capsys, link):
    """Issue 32: with README.md linked to a file elsewhere, that file grew by the ONNX section; with onnx/ linked to
    another folder, the graphs were written there. Both are refused with one line naming the link; nothing changes."""
    import os

    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "F"))
    target = tmp_path / ("card.md" if link == "README.md" else "elsewhere")
    if link == "README.md":
        target.write_text("# someone else's file\n")
    else:
        target.mkdir()
    os.symlink(target, folder / link)
    assert main([str(folder), "--no-quantize", "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert f"{folder / link} is a symbolic link" in err and "never writes through a link" in err, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    if link == "README.md":
        assert target.read_text() == "# someone else's file\n"
        assert not (folder / "onnx").exists()  # refused before the export wrote anything
        with pytest.raises(ValueError, match="README.md is a symbolic link"):  # the card writer on its own, too
            update_model_card(folder, "section")
        assert target.read_text() == "# someone else's file\n"
    else:
        assert not any(target.iterdir())


def test_the_export_validates_on_the_recorded_text_or_asks_for_it_by_name(tiny_model_dir, tmp_path, corpus, capsys):
    from export.cli import validation_text
    from gpt_serve.folders.corpus_record import CorpusRecord, write_corpus_record

    text_path = tmp_path / "my-text.txt"
    text_path.write_text(corpus[:5000], encoding="utf-8")
    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    write_corpus_record(folder, CorpusRecord.of(corpus[:5000], text_path, name="my text", description="a slice"))
    assert validation_text(folder, None) == (corpus[:5000], "my text (validation split)")  # no --data needed
    other = tmp_path / "other.txt"
    other.write_text("a different text\n", encoding="utf-8")
    assert validation_text(folder, other) == ("a different text\n", "other.txt (validation split)")  # --data wins
    text_path.write_text(corpus[:4000], encoding="utf-8")  # changed since: its hash no longer matches
    with pytest.raises(ValueError, match=r"trained on my text \(a slice\), but .*my-text.txt has changed since"):
        validation_text(folder, None)
    text_path.unlink()
    with pytest.raises(ValueError, match=r"trained on my text \(a slice\), but it is no longer at .*: pass --data"):
        validation_text(folder, None)
    capsys.readouterr()
    assert main([str(folder)]) == 2  # the CLI says so, before exporting anything, with the remedy once
    err = capsys.readouterr().err
    assert "it is no longer at" in err and err.count("--data PATH") == 1 and err.count("--no-quantize") == 1, err
    assert not (folder / "onnx").exists()


def test_a_validation_text_outside_the_vocabulary_is_named_as_not_the_training_text(tiny_model_dir, tmp_path):
    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    with pytest.raises(
        ValueError, match=r"code.py has 80 characters outside this model's vocabulary of 65 \('\(' at 5, .*not the text"
    ):
        export_model(folder, text="def f():\n    return {}\n" * 20, text_source="code.py", threads=1)


def test_the_cli_says_how_to_pass_the_training_text_naming_it_only_when_recorded(tiny_model_dir, tmp_path, capsys):
    from export.exporter import NotTheTrainingText
    from gpt_serve.folders.corpus_record import CorpusRecord, write_corpus_record

    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    code = tmp_path / "code.py"
    code.write_text("def f():\n    return {}\n" * 20, encoding="utf-8")
    with pytest.raises(NotTheTrainingText) as caught:
        export_model(folder, text=code.read_text(), text_source="code.py", threads=1)
    assert "--data" not in str(caught.value) and "corpus.json" not in str(caught.value)  # the library names no flag
    assert main([str(folder), "--data", str(code)]) == 2  # no corpus.json: no name for the text
    err = capsys.readouterr().err
    assert (
        "Pass --data PATH to the text this model was trained on, or --no-quantize" in err and "corpus.json" not in err
    )
    write_corpus_record(folder, CorpusRecord("my text", "a slice"))
    assert main([str(folder), "--data", str(code)]) == 2
    assert "Pass --data PATH to my text, the text this model was trained on (its corpus.json names it)" in (
        capsys.readouterr().err
    )
    assert not (folder / "onnx").exists()


def test_a_broken_corpus_json_stops_the_export_with_one_line(tiny_model_dir, tmp_path, capsys):
    folder = Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))
    (folder / "corpus.json").write_text("[" * 5000, encoding="utf-8")
    assert main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert "nested too deep" in err and "Traceback" not in err and len(err.splitlines()) == 1
