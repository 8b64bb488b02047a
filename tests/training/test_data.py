"""The training data: the lesson's split as ids, its random windows, and a failed download in the CLI."""

from __future__ import annotations

import pytest
import torch

from gpt_serve import CharTokenizer
from gpt_serve.folders import corpus as data_mod
from gpt_serve.folders.corpus import load_text
from training.data import CharDataset


@pytest.fixture(scope="module")
def full_ds(corpus, tokenizer):
    return CharDataset(corpus, tokenizer, block_size=8)


def test_split_is_the_lessons_first_90_percent(corpus, tokenizer, full_ds):
    ds = full_ds
    n = int(0.9 * len(corpus))
    assert torch.equal(ds.splits["train"], torch.tensor(tokenizer.vocab.encode(corpus[:n])))
    assert torch.equal(ds.splits["val"], torch.tensor(tokenizer.vocab.encode(corpus[n:])))
    assert len(ds.splits["train"]) == 1_003_854 and len(ds.splits["val"]) == 111_540  # the lesson's numbers


def test_vocabulary_is_the_sorted_characters_of_the_corpus(corpus, tokenizer):
    assert tokenizer.vocab.chars == sorted(set(corpus)) and len(tokenizer.vocab) == 65


def test_batches_are_random_contiguous_windows_shifted_by_one(full_ds):
    ds = full_ds
    x, y = ds.get_batch("train", 32, torch.Generator().manual_seed(3))
    assert x.shape == y.shape == (32, 8) and x.dtype == torch.long
    # The same draw as the lesson's get_batch: ix = randint(len(data) - block_size, (batch_size,)).
    ix = torch.randint(len(ds.splits["train"]) - 8, (32,), generator=torch.Generator().manual_seed(3))
    train = ds.splits["train"]
    for row, i in enumerate(ix.tolist()):
        assert torch.equal(x[row], train[i : i + 8]) and torch.equal(y[row], train[i + 1 : i + 9])
    assert len(set(ix.tolist())) > 1  # random, not one window repeated


def test_val_batches_come_only_from_the_last_10_percent():
    text = "a" * 900 + "b" * 100  # train is all 'a', val all 'b'
    tok = CharTokenizer.from_corpus(text)
    ds = CharDataset(text, tok, block_size=4)
    xv, yv = ds.get_batch("val", 64, torch.Generator().manual_seed(0))
    xt, yt = ds.get_batch("train", 64, torch.Generator().manual_seed(0))
    b, a = tok.vocab.stoi["b"], tok.vocab.stoi["a"]
    assert bool((xv == b).all() and (yv == b).all() and (xt == a).all() and (yt == a).all())


def test_windows_reach_both_ends_of_a_split():
    text = "abcdefghij" * 10  # 100 chars: train 90, val 10
    tok = CharTokenizer.from_corpus(text)
    ds = CharDataset(text, tok, block_size=8)
    x, y = ds.get_batch("val", 200, torch.Generator().manual_seed(0))  # val has 10 ids: starts 0 or 1
    val = ds.splits["val"]
    starts = {0 if torch.equal(row, val[:8]) else 1 for row in x}
    assert starts == {0, 1}
    assert torch.equal(y[x[:, 0] == val[1]][0], val[2:10])  # the last window ends on the split's last id


def test_same_generator_state_gives_the_same_batches(corpus):
    ds = CharDataset(corpus[:20_000], CharTokenizer.from_corpus(corpus[:20_000]), block_size=16)
    g = torch.Generator().manual_seed(7)
    state = g.get_state()
    first = ds.get_batch("train", 4, g)
    g.set_state(state)
    again = ds.get_batch("train", 4, g)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))


def test_tiled_windows_cover_the_split_without_overlap(full_ds):
    ds = full_ds
    x, y = ds.tiled_windows("val")
    val = ds.splits["val"]
    assert x.shape == ((len(val) - 1) // 8, 8)
    assert torch.equal(x.reshape(-1), val[: x.numel()]) and torch.equal(y.reshape(-1), val[1 : x.numel() + 1])


def test_a_split_shorter_than_a_window_is_refused():
    text = "abcdefghij" * 5
    message = r"the val split \(the last 10% of the text\) has 5 characters, fewer than block_size \+ 1 = 9 .*"
    with pytest.raises(ValueError, match=message + r"lower --model.block_size \(at most 4 for this text\)"):
        CharDataset(text, CharTokenizer.from_corpus(text), block_size=8)


def test_a_failed_download_says_what_to_do(tmp_path, monkeypatch, capsys):
    import urllib.error

    from training.cli import main

    def offline(url, timeout=None):
        raise urllib.error.URLError(OSError(-2, "Name or service not known"))

    monkeypatch.setenv("GPT_SERVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(data_mod.urllib.request, "urlopen", offline)
    with pytest.raises(ConnectionError, match="could not download Tiny Shakespeare.*Pass --data PATH"):
        load_text(None)
    assert main(["--preset", "tiny", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "Name or service not known" in err and "--data PATH" in err and "Traceback" not in err
    assert not (tmp_path / "cache" / "tinyshakespeare.txt").exists()
