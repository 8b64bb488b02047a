"""Fine-tuning (`--init-from`): the base's weights and ids kept, new characters added as transformers adds tokens,
the context shortened, the card naming the base, resume, and every error about the base."""

from __future__ import annotations

import json
import re

import pytest
import torch

from gpt_serve import CharGPTConfig, CharGPTForCausalLM, CharTokenizer
from gpt_serve.generation import load_backend
from training.cli import main
from training.preflight import resolve_base
from training.report import read_metrics
from training.trainer import Trainer

from .conftest import crash_at

NEW = "é§"  # characters Tiny Shakespeare lacks


def save_base(folder, text: str, tie: bool = False):
    """A tiny model folder with the vocabulary of `text`, random weights and a non-zero lm_head bias (the mean of
    the old biases must be visible)."""
    tokenizer = CharTokenizer.from_corpus(text)
    config = CharGPTConfig(
        vocab_size=tokenizer.vocab_size, vocab_sha256=tokenizer.vocab.sha256, block_size=16, n_embd=32, n_head=4,
        n_layer=2, dropout=0.0, tie_word_embeddings=tie, lm_head_bias=not tie,
    )  # fmt: skip
    torch.manual_seed(0)
    model = CharGPTForCausalLM(config)
    if not tie:
        with torch.no_grad():
            model.lm_head.bias.normal_(0.5, 0.1)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def base_text(corpus):
    return corpus[:20_000]


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory, base_text):
    return save_base(tmp_path_factory.mktemp("base") / "base", base_text)


def finetune(make_config, out, base, text=None, **overrides):
    settings = dict(init_from=str(base), sample_tokens=0, snapshots=0, model={})
    settings.update(overrides)
    cfg = make_config(out, **settings)
    cfg.model = settings["model"]  # the tiny preset's architecture does not apply: the base's does
    return Trainer(cfg, text=text)


def logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False).logits


def old_ids(n_old: int) -> torch.Tensor:
    return torch.randint(n_old, (3, 16), generator=torch.Generator().manual_seed(1))


def test_a_text_of_known_characters_keeps_the_vocabulary_and_every_logit(tmp_path, make_config, base_folder, corpus):
    base = load_backend(base_folder, "torch").backend.pretrained
    known = set(resolve_base(str(base_folder)).vocab.chars)
    t = finetune(make_config, tmp_path, base_folder, text="".join(c for c in corpus[40_000:70_000] if c in known))
    base_chars = resolve_base(str(base_folder)).vocab.chars
    assert t.tokenizer.vocab.chars == base_chars and t.prepared.new_chars == []
    assert t.model_config.vocab_size == len(base_chars) and t.model_config.vocab_sha256 == t.tokenizer.vocab.sha256
    ids = old_ids(len(base_chars))
    torch.testing.assert_close(logits(t.model, ids), logits(base, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tie", [False, True], ids=["own-lm-head", "tied-like-nanogpt"])
def test_new_characters_get_new_ids_and_leave_the_old_logits_unchanged(tmp_path, make_config, base_text, tie):
    folder = save_base(tmp_path / "base", base_text, tie=tie)
    base = load_backend(folder, "torch").backend.pretrained
    n = base.config.vocab_size
    text = base_text.replace("e", NEW[0]).replace("\n\n", NEW[1] + "\n")
    t = finetune(make_config, tmp_path / "run", folder, text=text)
    chars = t.tokenizer.vocab.chars
    assert chars[:n] == resolve_base(str(folder)).vocab.chars and chars[n:] == sorted(NEW)  # old ids unchanged
    assert t.model_config.vocab_size == n + 2 and t.dataset.splits["train"].max() == n + 1
    ids = old_ids(n)
    got = logits(t.model, ids)
    assert got.shape[-1] == n + 2
    torch.testing.assert_close(got[..., :n], logits(base, ids), rtol=1e-5, atol=1e-5)
    # transformers' mean resizing: the new rows are the mean of the old ones (sampled with 1e-9 x their covariance)
    emb = t.model.get_input_embeddings().weight.detach()
    torch.testing.assert_close(emb[n:], emb[:n].mean(0).expand(2, -1), rtol=0, atol=1e-4)
    head = t.model.get_output_embeddings()
    if tie:
        assert head.weight.data_ptr() == emb.data_ptr()
    else:
        torch.testing.assert_close(head.weight[n:], head.weight[:n].mean(0).expand(2, -1), rtol=0, atol=1e-4)
        torch.testing.assert_close(head.bias[n:], head.bias[:n].mean().expand(2), rtol=0, atol=1e-4)


def test_a_shorter_context_keeps_the_first_positions(tmp_path, make_config, base_folder, base_text):
    base = load_backend(base_folder, "torch").backend.pretrained
    t = finetune(make_config, tmp_path, base_folder, text=base_text, model={"block_size": 8, "dropout": 0.1})
    assert t.model_config.block_size == 8 and t.dataset.block_size == 8 and t.model_config.dropout == 0.1
    positions = t.model.model.position_embedding_table.weight
    torch.testing.assert_close(positions, base.model.position_embedding_table.weight[:8], rtol=0, atol=0)
    ids = old_ids(base.config.vocab_size)[:, :8]
    torch.testing.assert_close(logits(t.model, ids), logits(base, ids), rtol=1e-5, atol=1e-5)


def test_the_card_names_the_base_and_its_loss_before_fine_tuning(tmp_path, make_config, base_folder, base_text):
    t = finetune(make_config, tmp_path, base_folder, text=base_text + NEW, max_iters=4, eval_interval=2, snapshots=1)
    t.fit()
    start = read_metrics(tmp_path)[0]
    assert start["step"] == 0
    card = (tmp_path / "README.md").read_text()
    front = card.split("---")[1]
    assert "base_model: base\n" in front
    assert "fine-tuned with gpt-serve from `base`" in card
    assert "| base model | `base` (a model folder; 2 new characters added) |" in card
    assert f"| base model on this text | validation loss {start['val_loss']:.4f}, train loss " in card
    assert "base_model: base\n" in (tmp_path / "snapshots" / "step-000002" / "README.md").read_text()
    loaded = load_backend(tmp_path, "torch")  # the folder loads, its vocabulary the extended one
    assert loaded.vocab.chars == t.tokenizer.vocab.chars
    assert json.loads((tmp_path / "config.json").read_text())["vocab_size"] == len(loaded.vocab)


def test_from_a_shipped_model_the_card_says_so(tmp_path, make_config, base_text):
    t = finetune(make_config, tmp_path, "ladder-a", text=base_text, max_iters=1, eval_interval=1, eval_iters=1)
    t.fit()
    card = (tmp_path / "README.md").read_text()
    assert "base_model: ladder-a\n" in card and "(a model shipped with gpt-serve; its vocabulary)" in card


def test_resume_repeats_the_uninterrupted_fine_tuning(tmp_path, make_config, base_folder, base_text):
    """A fine-tuning run that crashes after its checkpoint at step 3 and is resumed ends where the full run ends."""
    settings = dict(text=base_text + NEW, max_iters=6, eval_interval=3, model={"dropout": 0.1})
    full = finetune(make_config, tmp_path / "full", base_folder, **settings)
    full.fit()
    with crash_at(4):
        finetune(make_config, tmp_path / "part", base_folder, **settings).fit()
    resumed = finetune(make_config, tmp_path / "part", base_folder, resume=True, **settings)
    resumed.fit()
    for (name, a), b in zip(resumed.model.state_dict().items(), full.model.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    losses = [m["val_loss"] for m in read_metrics(tmp_path / "full")]
    assert [m["val_loss"] for m in read_metrics(tmp_path / "part")] == losses


def test_resuming_from_another_base_is_refused(tmp_path, make_config, base_folder, base_text):
    other = save_base(tmp_path / "other", base_text)
    finetune(make_config, tmp_path / "run", base_folder, text=base_text, max_iters=2, eval_interval=2).fit()
    with pytest.raises(ValueError, match="init_from is .*base.* there and .*other.* here"):
        finetune(make_config, tmp_path / "run", other, text=base_text, max_iters=2, eval_interval=2, resume=True).fit()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--init-from", "no-such-model"], r"--init-from: unknown model 'no-such-model': shipped models are \["),
        (["--init-from", "{data}"], r"--init-from .* is a file, not a model folder.*gpt-serve import"),
        (["--init-from", "{tmp}"], r"--init-from: .* is a folder but not a model folder: it has no config.json"),
        (["--init-from", "{run}"], r"is a training run that has not saved its model yet.*--resume.*snapshots/"),
        (
            ["--init-from", "ladder-a", "--model.block_size", "9"],
            r"--model.block_size 9 is longer than the context ladder-a was trained with \(8 learned positions\): .*"
            r"at most 8\. Lower --model.block_size",
        ),
        (["--init-from", "ladder-a", "--model.n_layer", "2"], r"--model.n_layer: a run with --init-from keeps the"),
        (["--init-from", "ladder-a", "--preset", "tiny"], r"--preset tiny sets an architecture, and --init-from"),
        (["--preset", "finetune"], r"--preset finetune fine-tunes a model you have: give it with --init-from"),
    ],
)
def test_every_error_about_the_base_names_the_flag(tmp_path, small_data_path, capsys, args, message):
    run = tmp_path / "unfinished"
    (run / "checkpoints").mkdir(parents=True)
    args = [a.format(data=small_data_path, tmp=tmp_path, run=run) for a in args]
    argv = ["--out", str(tmp_path / "out"), "--data", str(small_data_path), "--no-progress", *args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.splitlines()) == 1
    assert re.search(message, err), err
