"""gpt_serve.folders.importing (with checkpoints, conversion, import_card) and `gpt-serve import`: checkpoints of
the lesson's gpt.py and of nanoGPT, built from their public layouts (`checkpoint_sources.py`), become model folders
that compute what their sources compute; bad input is one line, exit 2, and nothing written; a pickle with a code
payload runs nothing."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from gpt_serve import CharGPTForCausalLM
from gpt_serve.cli import main
from gpt_serve.folders.checkpoints import read_meta
from gpt_serve.folders.corpus import TINY_SHAKESPEARE_CHARS
from gpt_serve.folders.corpus_record import read_corpus_record
from gpt_serve.folders.importing import LESSON, NANOGPT, convert, import_checkpoint
from gpt_serve.generation import SamplingParams, generate_tokens, load_backend
from tests.folders.checkpoint_sources import (
    GPT,
    GPTLanguageModel,
    greedy,
    save_lesson,
    save_nanogpt,
    train_a_little,
    write_meta,
)

CHARS = list(TINY_SHAKESPEARE_CHARS)
GREEDY = SamplingParams(temperature=0)
PROMPT = "ROMEO:\nWhat"
NEW_TOKENS = 40  # past block_size 16 twice: the window slides


@pytest.fixture(scope="module")
def ids(corpus) -> torch.Tensor:
    stoi = {c: i for i, c in enumerate(CHARS)}
    return torch.tensor([stoi[c] for c in corpus[:100_000]])


@pytest.fixture(scope="module")
def lesson(ids):
    torch.manual_seed(1)
    return train_a_little(GPTLanguageModel(len(CHARS)), ids)


@pytest.fixture(scope="module")
def nanogpt(ids):
    torch.manual_seed(2)
    return train_a_little(GPT(len(CHARS)), ids)  # shakespeare_char's bias=False


def encode(text: str) -> list[int]:
    return [CHARS.index(c) for c in text]


def assert_computes_as(folder: Path, reference, ids: torch.Tensor) -> None:
    """The folder's model: logits within 1e-5 of the reference's on a batch, and the same greedy tokens past
    block_size (the lesson's `idx[:, -block_size:]`, gpt-serve's `window_mode="exact"`) through `load_backend`."""
    model = CharGPTForCausalLM.from_pretrained(folder).eval()
    batch = ids[: 4 * 16].view(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(model(batch).logits, reference(batch), atol=1e-5, rtol=0)
    loaded = load_backend(folder, "torch", threads=1)
    tokens = generate_tokens(loaded.backend, [encode(PROMPT)], NEW_TOKENS, GREEDY, window_mode="exact")
    assert [int(t[0]) for t in tokens] == greedy(reference, encode(PROMPT), NEW_TOKENS)


# --- the two formats compute what their sources compute ---------------------------------------------------------


def test_a_lesson_state_dict_becomes_a_folder_with_the_same_logits_and_tokens(tmp_path, lesson, ids, data_path):
    source = save_lesson(lesson, tmp_path / "gpt.pt")
    imported = import_checkpoint(source, tmp_path / "model", corpus=data_path)
    assert imported.source_format == LESSON
    config = imported.model.config
    # every hyperparameter from the tensors: heads from how many modules there are
    assert (config.n_layer, config.n_head, config.n_embd, config.block_size, config.ffwd_mult) == (2, 4, 32, 16, 4)
    assert (config.activation, config.bias, config.qkv_bias, config.tie_word_embeddings) == ("relu", True, False, False)
    assert_computes_as(tmp_path / "model", lesson, ids)


def test_a_lesson_state_dict_scaled_by_n_embd_needs_attn_scale(tmp_path, ids):
    """gpt.py as typed in the video scaled the scores by C**-0.5: the state dict cannot tell, the flag can."""
    torch.manual_seed(3)
    video = train_a_little(GPTLanguageModel(len(CHARS), scale_by="n_embd"), ids)
    source = save_lesson(video, tmp_path / "gpt.pt")
    import_checkpoint(source, tmp_path / "model", attn_scale="n_embd")  # Tiny Shakespeare's characters by default
    assert_computes_as(tmp_path / "model", video, ids)
    wrong = convert(source).model  # the final gpt.py's scale: other logits
    with torch.no_grad():
        assert (wrong(ids[:16][None]).logits - video(ids[:16][None])).abs().max() > 1e-3


@pytest.mark.parametrize("compiled, flash", [(True, True), (False, False)], ids=["compiled", "mask-buffer"])
def test_a_nanogpt_checkpoint_becomes_a_folder_with_the_same_logits_and_tokens(tmp_path, nanogpt, ids, compiled, flash):
    if not flash:  # nanoGPT without flash attention: the mask is a buffer named `bias`, and bias=True throughout
        torch.manual_seed(4)
        nanogpt = train_a_little(GPT(len(CHARS), n_head=4, bias=True, flash=False), ids)
    source = save_nanogpt(nanogpt, tmp_path / "nanoGPT", CHARS, compiled=compiled)
    assert any(k.startswith("_orig_mod.") for k in torch.load(source)["model"]) == compiled
    imported = import_checkpoint(source, tmp_path / "model")  # meta.pkl found in data/shakespeare_char/
    assert imported.source_format == NANOGPT and imported.training["iter_num"] == 6
    config = imported.model.config
    assert (config.activation, config.tie_word_embeddings, config.lm_head_bias) == ("gelu", True, False)
    assert config.bias == config.qkv_bias == config.layer_norm_bias == (not flash)
    assert_computes_as(tmp_path / "model", nanogpt, ids)


def test_a_nanogpt_lm_head_trained_apart_from_the_embedding_stays_its_own(tmp_path, ids):
    torch.manual_seed(6)
    untied = GPT(len(CHARS))
    untied.lm_head.weight = torch.nn.Parameter(untied.lm_head.weight.detach().clone())
    train_a_little(untied, ids)
    source = save_nanogpt(untied, tmp_path / "nanoGPT", CHARS)
    assert not import_checkpoint(source, tmp_path / "model").model.config.tie_word_embeddings
    assert_computes_as(tmp_path / "model", untied, ids)


def test_the_folder_is_complete_and_names_its_source(tmp_path, nanogpt, tiny_model_dir):
    source = save_nanogpt(nanogpt, tmp_path / "nanoGPT", CHARS)
    shutil.copy(source.parent.parent / "data" / "shakespeare_char" / "meta.pkl", source.parent)  # beside it
    imported = import_checkpoint(source, tmp_path / "model", command="gpt-serve import ckpt.pt model")
    folder = tmp_path / "model"
    like_training = sorted(p.name for p in tiny_model_dir.iterdir()) + ["README.md", "corpus.json"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(like_training)
    record = read_corpus_record(folder)  # what it was given: the 65 characters of Tiny Shakespeare
    assert record.name == "Tiny Shakespeare" and record.default_prompt in (folder / "README.md").read_text()
    config = json.loads((folder / "config.json").read_text())
    assert config["vocab_sha256"] == imported.vocab.sha256 and config["tie_word_embeddings"] is True
    card = (folder / "README.md").read_text()
    assert str(source.resolve()) in card and imported.source_sha256 in card and "gpt-serve import ckpt.pt model" in card
    assert "iter_num 6" in card and "## Sample" in card
    from safetensors import safe_open

    with safe_open(folder / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys()  # tied: saved once, as the token embedding


def test_meta_pkl_is_looked_for_where_nanogpt_puts_it_or_given(tmp_path, nanogpt):
    source = save_nanogpt(nanogpt, tmp_path / "nanoGPT", CHARS, dataset="shakespeare_char")
    moved = tmp_path / "elsewhere.pkl"
    os.replace(tmp_path / "nanoGPT" / "data" / "shakespeare_char" / "meta.pkl", moved)
    with pytest.raises(ValueError, match="no meta.pkl for .*pass it with --meta"):
        convert(source)
    assert convert(source, meta=moved).vocab.chars == CHARS


# --- safe by construction ---------------------------------------------------------------------------------------


class Payload:
    """What a malicious pickle does: building this object creates a file (any code could run instead)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


@pytest.mark.parametrize("where", ["meta.pkl", "ckpt.pt", "gpt.pt"])
def test_a_pickle_with_a_code_payload_is_refused_and_runs_nothing(tmp_path, nanogpt, lesson, capsys, where):
    created = tmp_path / "pwned"
    source = save_nanogpt(nanogpt, tmp_path / "nanoGPT", CHARS)
    meta = source.parent.parent / "data" / "shakespeare_char" / "meta.pkl"
    if where == "meta.pkl":
        with open(meta, "wb") as f:
            pickle.dump({"vocab_size": 65, "itos": Payload(created), "stoi": {}}, f)
    elif where == "ckpt.pt":
        checkpoint = torch.load(source)
        torch.save({**checkpoint, "config": Payload(created)}, source)
    else:
        source = tmp_path / "gpt.pt"
        torch.save({**lesson.state_dict(), "extra": Payload(created)}, source)
    assert main(["import", str(source), str(tmp_path / "model")]) == 2
    err = capsys.readouterr().err
    assert "is refused: it asks to import" in err and "open" in err
    assert not created.exists() and not (tmp_path / "model").exists()
    if where == "meta.pkl":  # the payload is real: an unrestricted unpickler runs it
        with open(meta, "rb") as f:
            pickle.load(f)
        assert created.exists()


def test_meta_pkl_admits_only_dicts_strings_and_integers(tmp_path):
    path = tmp_path / "meta.pkl"
    with open(path, "wb") as f:
        pickle.dump({"vocab_size": 2, "itos": {0: "a", 1: "b"}, "stoi": {"a": 0, "b": 1}, "extra": [1.5]}, f)
    with pytest.raises(ValueError, match="other than dicts, strings and integers"):
        read_meta(path)
    write_meta(path, ["a", "b"])
    assert read_meta(path).chars == ["a", "b"]


# --- bad input: one line, exit 2, nothing written ---------------------------------------------------------------


def _lesson_without(lesson, tmp_path, name):
    state = lesson.state_dict()
    del state[name]
    torch.save(state, tmp_path / "gpt.pt")
    return [tmp_path / "gpt.pt"]


def _lesson_with(lesson, tmp_path, name, tensor):
    torch.save({**lesson.state_dict(), name: tensor}, tmp_path / "gpt.pt")
    return [tmp_path / "gpt.pt"]


def _nanogpt_with_args(nanogpt, tmp_path, **changes):
    source = save_nanogpt(nanogpt, tmp_path / "nanoGPT", CHARS)
    checkpoint = torch.load(source)
    torch.save({**checkpoint, "model_args": {**checkpoint["model_args"], **changes}}, source)
    return [source]


def _gpt2_bpe(tmp_path):
    """A nanoGPT checkpoint on GPT-2's BPE vocabulary (init_from='gpt2' or an openwebtext run): no meta.pkl."""
    torch.manual_seed(5)
    model = GPT(50304, n_embd=8, n_head=2, n_layer=1)
    source = save_nanogpt(model, tmp_path / "nanoGPT", CHARS, dataset="openwebtext")
    os.remove(source.parent.parent / "data" / "openwebtext" / "meta.pkl")
    return [source]


def _full_disk(monkeypatch):
    def no_space(self, folder, *args, **kwargs):
        (Path(folder) / "config.json").write_text("{}")  # half written, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(CharGPTForCausalLM, "save_pretrained", no_space)


def _text(tmp_path, text):
    (tmp_path / "file").write_text(text)
    return tmp_path / "file"


BAD_INPUTS = {
    "not a checkpoint": (lambda t, m, n, mp: [_text(t, "hello\n")], "is not a PyTorch checkpoint"),
    "neither format": (
        lambda t, m, n, mp: (torch.save({"weights": torch.zeros(2)}, t / "x.pt"), [t / "x.pt"])[1],
        r"is neither a state dict of the lesson's gpt.py .* nor a nanoGPT ckpt.pt .*: it holds a dict with keys",
    ),
    "a whole pickled model": (
        lambda t, m, n, mp: (torch.save(m, t / "m.pt"), [t / "m.pt"])[1],
        r"asks to import .*GPTLanguageModel.*save model.state_dict\(\) instead",
    ),
    "missing tensor": (
        lambda t, m, n, mp: _lesson_without(m, t, "blocks.1.ln2.weight"),
        r"missing tensors of the lesson's gpt.py: \['blocks.1.ln2.weight'\]",
    ),
    "a tensor of another architecture": (
        lambda t, m, n, mp: _lesson_with(m, t, "blocks.0.sa.heads.0.key.bias", torch.zeros(8)),
        r"tensors that the lesson's gpt.py does not have: \['blocks.0.sa.heads.0.key.bias'\]",
    ),
    "contradicting shapes": (
        lambda t, m, n, mp: _lesson_with(m, t, "blocks.1.ffwd.net.0.weight", torch.zeros(64, 32)),
        r"blocks.1.ffwd.net.0.weight has shape \(64, 32\), but \(128, 32\) is expected .* contradict each other",
    ),
    "heads that do not add up": (
        lambda t, m, n, mp: _lesson_with(m, t, "blocks.0.sa.heads.0.key.weight", torch.zeros(6, 32)),
        r"the heads of blocks.0 \(4 x head_size 6\) must add up to n_embd 32",
    ),
    "model_args against the tensors": (
        lambda t, m, n, mp: _nanogpt_with_args(n, t, n_embd=64, n_head=4),
        r"transformer.wte.weight has shape \(65, 32\), but \(65, 64\) is expected .* contradict each other",
    ),
    "a corpus of the wrong size": (
        lambda t, m, n, mp: [save_lesson(m, t / "gpt.pt"), "--corpus", _text(t, "to be or not to be\n")],
        r"the vocabulary has 8 characters but the checkpoint's token embedding has vocab_size 65",
    ),
    "a meta.pkl of the wrong size": (
        lambda t, m, n, mp: [
            save_nanogpt(n, t / "nanoGPT", CHARS),
            "--meta",
            write_meta(t / "other.pkl", list("abc")),
        ],
        r"the vocabulary has 3 characters but the checkpoint's model_args has vocab_size 65",
    ),
    "no meta.pkl": (
        lambda t, m, n, mp: [save_nanogpt(n, t / "nanoGPT", CHARS), "--meta", t / "missing.pkl"],
        r"meta.pkl not found: .*missing.pkl",
    ),
    "GPT-2 BPE": (
        lambda t, m, n, mp: _gpt2_bpe(t),
        r"a nanoGPT checkpoint on GPT-2's BPE vocabulary \(vocab_size 50304, no meta.pkl\): gpt-serve serves "
        "character-level models",
    ),
    "the output exists": (
        lambda t, m, n, mp: ((t / "model").mkdir(), (t / "model" / "keep").write_text("x"), [save_lesson(m, t / "g")])[
            -1
        ],
        r"the output folder .*model exists; choose another, or pass --force to replace it",
    ),
    "a full disk": (
        lambda t, m, n, mp: (_full_disk(mp), [save_lesson(m, t / "gpt.pt")])[1],
        r"no space left on the device to write",
    ),
    "no checkpoint": (lambda t, m, n, mp: [t / "nothing.pt"], r"checkpoint not found: .*nothing.pt"),
    # issue 32: a FIFO is named, never opened (it would block); the output folder is never a link's target
    "a checkpoint that is a FIFO": (
        lambda t, m, n, mp: (os.mkfifo(t / "gpt.pt"), [t / "gpt.pt"])[1],
        r"gpt.pt is not a regular file: it is a FIFO",
    ),
    "an output folder that is a link": (
        lambda t, m, n, mp: (
            (t / "elsewhere").mkdir(),
            (t / "new").mkdir(),
            os.symlink(t / "elsewhere", t / "new" / "model"),
            [save_lesson(m, t / "gpt.pt")],
        )[-1],
        r"new/model is a symbolic link \(to .*elsewhere\); gpt-serve never writes through a link",
    ),
    "an unknown attention scale": (
        lambda t, m, n, mp: [save_lesson(m, t / "gpt.pt"), "--attn-scale", "C"],
        r"attn_scale must be one of \('head_size', 'n_embd'\), got 'C'",
    ),
    "an attention scale for nanoGPT": (
        lambda t, m, n, mp: [save_nanogpt(n, t / "nanoGPT", CHARS), "--attn-scale", "n_embd"],
        r"attn_scale applies to the lesson's gpt.py only",
    ),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, lesson, nanogpt, monkeypatch, capsys, case):
    make, message = BAD_INPUTS[case]
    args = [str(a) for a in make(tmp_path, lesson, nanogpt, monkeypatch)]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    out = tmp_path / "model" if case == "the output exists" else tmp_path / "new" / "model"
    assert main(["import", args[0], str(out), *args[1:], "--no-export"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpt-serve: error: ") and err.count("\n") == 1, err
    assert re.search(message, err), err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written, nothing left


def test_force_replaces_a_folder_but_never_the_checkpoint_inside_it(tmp_path, lesson):
    out = tmp_path / "model"
    out.mkdir()
    (out / "old-file").write_text("x")
    source = save_lesson(lesson, tmp_path / "gpt.pt")
    import_checkpoint(source, out, force=True)
    assert (out / "config.json").is_file() and not (out / "old-file").exists()
    inside = save_lesson(lesson, out / "gpt.pt")
    with pytest.raises(ValueError, match="--force would delete .*gpt.pt, which is inside"):
        import_checkpoint(inside, out, force=True)
    assert inside.is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


# --- the command, with the ONNX export ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["lesson", "nanogpt"])
def test_the_command_writes_an_onnx_export_that_validates(tmp_path, lesson, nanogpt, data_path, capsys, kind):
    if kind == "lesson":
        args, reference = [save_lesson(lesson, tmp_path / "gpt.pt"), "--corpus", data_path], lesson
    else:
        source = save_nanogpt(nanogpt, tmp_path / "nanoGPT", CHARS)
        shutil.copy(data_path, source.parent.parent / "data" / "shakespeare_char" / "input.txt")  # as prepare.py
        args, reference = [source], nanogpt
    out = tmp_path / "model"
    assert main(["import", str(args[0]), str(out), *map(str, args[1:]), "--threads", "1"]) == 0
    printed = capsys.readouterr()
    assert "gpt-serve import: wrote" in printed.err and "PASS: written to" in printed.out
    assert "characters of tinyshakespeare.txt" in printed.out or "characters of input.txt" in printed.out
    card = (out / "README.md").read_text()
    assert "<!-- gpt-serve:onnx:begin" in card and f"\ngpt-serve import {args[0]} {out} " in card
    loaded = load_backend(out, "onnx", threads=1)  # fp32: the same greedy tokens as the source, past block_size
    tokens = generate_tokens(loaded.backend, [encode(PROMPT)], NEW_TOKENS, GREEDY, window_mode="exact")
    np.testing.assert_array_equal([int(t[0]) for t in tokens], greedy(reference, encode(PROMPT), NEW_TOKENS))
    assert load_backend(out, "onnx-int8", threads=1).block_size == 16


def test_without_the_export_app_the_folder_is_written_and_the_command_says_how(tmp_path, lesson, monkeypatch, capsys):
    import gpt_serve.cli.apps

    monkeypatch.setattr(gpt_serve.cli.apps, "app_commands", lambda: {})
    source = save_lesson(lesson, tmp_path / "gpt.pt")
    assert main(["import", str(source), str(tmp_path / "model"), "--threads", "1"]) == 0
    err = capsys.readouterr().err
    assert "not exported to ONNX (the export application is not installed)" in err
    assert f"gpt-serve export {tmp_path / 'model'}" in err
    assert (tmp_path / "model" / "config.json").is_file() and not (tmp_path / "model" / "onnx").exists()


# --- the folder's corpus record and the card's words ------------------------------------------------------------


def test_a_nanogpt_dataset_name_of_any_kind_gives_a_record_its_reader_takes(tmp_path):
    """The checkpoint's dataset name is made fit for a record (one line, cut short), and the prompts come from
    train.bin, which the validation never measures (val.bin only when there is no train.bin)."""
    from gpt_serve.chargpt.vocab import CharVocab
    from gpt_serve.folders.corpus_record import write_corpus_record
    from gpt_serve.folders.importing import corpus_record

    vocab = CharVocab(list("\nABCDEFGHIJKLMNOPQRSTUVWXYZ:ab "))
    meta = write_meta(tmp_path / "data" / "odd" / "meta.pkl", vocab.chars)
    train = "TRAIN:\nab ab\n\nTRAINING:\nba ba\n\n" * 40
    val = "VAL:\nab\n\n" * 40
    for name, text in (("train", train), ("val", val)):
        np.asarray(vocab.encode(text), dtype=np.uint16).tofile(meta.parent / f"{name}.bin")
    for dataset in ("x|y\n" * 300, "\0\t", None):
        record = corpus_record(None, vocab, dataset, meta)
        write_corpus_record(tmp_path, record)
        assert read_corpus_record(tmp_path) == record
        assert "\n" not in record.name and len(record.name) <= 100 and record.prompts
        assert all(p.startswith("TRAIN") for p in record.prompts)
    assert corpus_record(None, vocab, "\0\t", meta).name == "odd"  # nothing left of it: the dataset's folder
    (meta.parent / "train.bin").unlink()
    assert all(p.startswith("VAL") for p in corpus_record(None, vocab, "odd", meta).prompts)


def test_the_card_escapes_the_texts_name_and_gives_no_prompt_without_one(tmp_path, tiny_model_dir, tokenizer):
    from gpt_serve.folders.conversion import Imported
    from gpt_serve.folders.corpus_record import CorpusRecord
    from gpt_serve.folders.import_card import model_card

    model = CharGPTForCausalLM.from_pretrained(tiny_model_dir).eval()
    imported = Imported(model, tokenizer.vocab, NANOGPT, tmp_path / "ckpt.pt", "0" * 64, "meta.pkl")
    card = model_card(imported, "m", None)
    assert "gpt-serve generate PATH --max-new-tokens 200" in card and "--prompt" not in card  # not a newline
    assert "| training text | not recorded |" in card
    record = CorpusRecord("a | b", "c *d*", ("KING:\nHark",))
    card = model_card(dataclasses.replace(imported, corpus_record=record), "m", None)
    assert r"| training text | a \| b (c \*d\*) |" in card  # one row, its columns intact
    assert "gpt-serve generate PATH --prompt 'KING:\nHark' --max-new-tokens 200" in card
