"""CharTokenizer: the lesson's vocabulary, exact round trips, unknown-character policies, padding."""

from pathlib import Path

import pytest

from gpt_serve import CharTokenizer
from gpt_serve.chargpt.vocab import CharVocab
from gpt_serve.folders.corpus import TINY_SHAKESPEARE_CHARS


def test_vocabulary_is_the_lessons(tokenizer, corpus):
    assert tokenizer.vocab_size == 65
    assert tokenizer.vocab.chars == sorted(set(corpus))
    assert tokenizer.convert_tokens_to_ids("\n") == 0  # the lesson starts generation from id 0
    assert tokenizer.pad_token == "<pad>" and tokenizer.pad_token_id == 65


def test_whole_corpus_round_trips(tokenizer, corpus):
    ids = tokenizer.vocab.encode(corpus)
    assert len(ids) == len(corpus) == 1_115_394
    assert tokenizer.vocab.decode(ids) == corpus
    head = corpus[:5000]  # the transformers path, on a slice (it is slower)
    assert tokenizer.decode(tokenizer(head)["input_ids"]) == head


def test_save_and_reload(tmp_path, tokenizer, corpus):
    tokenizer.save_pretrained(tmp_path)
    again = CharTokenizer.from_pretrained(tmp_path)
    assert again.get_vocab() == tokenizer.get_vocab()
    assert again(corpus[:300])["input_ids"] == tokenizer(corpus[:300])["input_ids"]
    assert again.padding_side == "left"


def test_unknown_characters_raise_by_default_naming_them(tokenizer):
    with pytest.raises(ValueError, match=r"2 characters outside the vocabulary: '€' at 3, 'é' at 8"):
        tokenizer("abc€def é")


def test_unknown_character_policies(tokenizer):
    drop = CharTokenizer(chars=tokenizer.vocab.chars, unk_policy="drop")
    assert drop.decode(drop("ab€c")["input_ids"]) == "abc"
    replace = CharTokenizer(chars=tokenizer.vocab.chars, unk_policy="replace", unk_replacement="?")
    assert replace.decode(replace("ab€c")["input_ids"]) == "ab?c"
    with pytest.raises(ValueError, match="unk_policy must be one of"):
        CharTokenizer(chars=tokenizer.vocab.chars, unk_policy="ignore")
    with pytest.raises(ValueError, match="unk_replacement '€' is not in the vocabulary"):
        CharTokenizer(chars=tokenizer.vocab.chars, unk_policy="replace", unk_replacement="€")


def test_policy_survives_save_pretrained(tmp_path, tokenizer):
    CharTokenizer(chars=tokenizer.vocab.chars, unk_policy="replace").save_pretrained(tmp_path)
    again = CharTokenizer.from_pretrained(tmp_path)
    assert again.unk_policy == "replace"
    assert again.decode(again("a€")["input_ids"]) == "a "


def test_left_padding_for_batches(tokenizer):
    batch = tokenizer(["First Citizen:", "Hi"], padding=True, return_tensors="pt")
    assert batch["input_ids"].shape == (2, 14)
    assert batch["attention_mask"][1].tolist() == [0] * 12 + [1, 1]
    assert batch["input_ids"][1, :12].eq(tokenizer.pad_token_id).all()


@pytest.mark.parametrize(
    "chars, message",
    [([], "at least one character"), (["a", "a"], "duplicate characters"), (["ab"], "single character")],
)
def test_bad_vocabularies(chars, message):
    with pytest.raises(ValueError, match=message):
        CharVocab(chars)


def test_vocab_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="vocabulary file not found"):
        CharVocab.from_file(tmp_path / "nope.json")
    bad = tmp_path / "vocab.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        CharVocab.from_file(bad)
    bad.write_text('{"a": 0, "b": 5}')
    with pytest.raises(ValueError, match="distinct id 0..n-1"):
        CharVocab.from_file(bad)


def test_decode_rejects_ids_outside_vocabulary(tokenizer):
    with pytest.raises(ValueError, match="token id 99 is outside the vocabulary"):
        tokenizer.vocab.decode([1, 99])


def test_saving_writes_a_tokenizer_json_with_the_same_ids(tmp_path, tokenizer, corpus):
    from tokenizers import Tokenizer

    tokenizer.save_pretrained(tmp_path)
    fast = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert fast.encode(corpus).ids == tokenizer.vocab.encode(corpus)  # all 1,115,394 characters
    assert fast.decode(fast.encode(corpus[:3000]).ids) == corpus[:3000]
    assert fast.token_to_id("<pad>") == tokenizer.pad_token_id == 65


def test_a_tokenizer_json_that_disagrees_is_refused(tmp_path, tokenizer):
    import json

    tokenizer.save_pretrained(tmp_path)
    fast = json.loads((tmp_path / "tokenizer.json").read_text(encoding="utf-8"))
    fast["model"]["vocab"]["a"], fast["model"]["vocab"]["b"] = fast["model"]["vocab"]["b"], fast["model"]["vocab"]["a"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(fast), encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer.json and .*vocab.json disagree .*\('a', 39\)"):
        CharTokenizer.from_pretrained(tmp_path)


# characters outside Tiny Shakespeare's vocabulary: accents, CJK, an emoji, a tab, a carriage return, and the
# characters a regular expression's class would read as syntax
UNKNOWN = "ROMEO: héllo, 你好 😀\tworld\r\n[x]^-\\ & <b>"


@pytest.mark.parametrize("policy", ["error", "replace", "drop"])
def test_tokenizer_json_applies_the_packages_unknown_character_policy(tmp_path, policy):
    """`tokenizers` alone, in a venv that holds nothing else (no gpt_serve, transformers or numpy), reads a saved
    tokenizer.json and gives the package's ids for text with unknown characters: `replace` (each a space), or `drop`
    for a tokenizer saved with that policy; the default `error` cannot be written into a file, and is `replace`."""
    import json
    import subprocess

    from tests.helpers import python_with_only

    CharTokenizer(chars=list(TINY_SHAKESPEARE_CHARS), unk_policy=policy).save_pretrained(tmp_path / "tok")
    python = python_with_only("tokenizers", tmp_path / "venv")
    script = f"""
import importlib.util, json
from tokenizers import Tokenizer
tok = Tokenizer.from_file("tok/tokenizer.json")
alone = [importlib.util.find_spec(name) is None for name in ("gpt_serve", "transformers", "numpy")]
print(json.dumps([alone, tok.encode({UNKNOWN!r}).ids, tok.decode(tok.encode("JULIET:").ids)]))
"""
    result = subprocess.run([str(python), "-I", "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    alone, ids, decoded = json.loads(result.stdout)
    vocab = CharVocab(list(TINY_SHAKESPEARE_CHARS))
    assert alone == [True, True, True] and decoded == "JULIET:"
    assert ids == vocab.encode(UNKNOWN, "drop" if policy == "drop" else "replace")


def test_autotokenizer_loads_a_saved_folder_without_gpt_serve_or_remote_code(tmp_path, tiny_model_dir, corpus):
    """transformers alone (gpt_serve blocked) reads tokenizer.json: same ids, exact decode, left padding with <pad>.

    A data-only folder (as shipped) needs no argument; a folder with the remote-code bundle (as training saves it)
    takes `trust_remote_code=False`, else transformers asks whether to run its code."""
    import json
    import shutil

    from gpt_serve.chargpt.vocab import CharVocab
    from tests.conftest import run_without_gpt_serve

    plain = Path(shutil.copytree(tiny_model_dir, tmp_path / "plain", ignore=shutil.ignore_patterns("*.py")))
    config = json.loads((plain / "config.json").read_text())
    del config["auto_map"]
    (plain / "config.json").write_text(json.dumps(config))
    text = corpus[:20_000]
    (tmp_path / "text.txt").write_text(text, encoding="utf-8")
    script = f"""
        import json
        from transformers import AutoTokenizer

        text = open("text.txt", encoding="utf-8").read()
        for folder, kwargs in (({str(plain)!r}, {{}}), ({str(tiny_model_dir)!r}, {{"trust_remote_code": False}})):
            tok = AutoTokenizer.from_pretrained(folder, **kwargs)
            ids = tok(text).input_ids
            batch = tok(["ab", "abcd"], padding=True)
            result = [type(tok).__name__, ids, tok.decode(ids) == text, batch.input_ids, batch.attention_mask]
            result.append(tok({UNKNOWN!r}).input_ids)
            print("RESULT " + json.dumps(result))
    """
    result = run_without_gpt_serve(script, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line.removeprefix("RESULT ") for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 2, result.stdout[-2000:] + result.stderr[-2000:]
    want = CharVocab.from_file(tiny_model_dir / "vocab.json").encode(text)
    for line in lines:
        kind, ids, exact, padded, mask, unknown = json.loads(line)
        assert kind == "TokenizersBackend" and ids == want and exact
        assert unknown == CharVocab.from_file(tiny_model_dir / "vocab.json").encode(UNKNOWN, "replace")
        assert padded == [[65, 65, 39, 40], [39, 40, 41, 42]] and mask == [[0, 0, 1, 1], [1, 1, 1, 1]]


def test_a_reloaded_tokenizer_saves_no_loading_options(tmp_path, tokenizer):
    import json

    tokenizer.save_pretrained(tmp_path / "a")
    CharTokenizer.from_pretrained(tmp_path / "a").save_pretrained(tmp_path / "b")
    saved = json.loads((tmp_path / "b" / "tokenizer_config.json").read_text())
    assert "is_local" not in saved and "local_files_only" not in saved


@pytest.mark.parametrize("name", ["shakespeare", "ladder-a", "ladder-b", "ladder-c", "ladder-d", "ladder-e"])
def test_the_shipped_tokenizer_json_files_apply_the_replace_policy(name):
    from tokenizers import Tokenizer

    from gpt_serve.chargpt.tokenization_chargpt import fast_tokenizer
    from gpt_serve.models import model_path

    folder = model_path(name)
    vocab = CharTokenizer.from_pretrained(folder).vocab
    assert (folder / "tokenizer.json").read_text("utf-8") == fast_tokenizer(vocab).to_str(pretty=True)
    fast = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert fast.encode(UNKNOWN).ids == vocab.encode(UNKNOWN, "replace")


def test_the_documented_tokenizer_route_is_quiet_on_a_shipped_folder(tmp_path):
    """docs/runtimes.md's route without gpt_serve, `PreTrainedTokenizerFast.from_pretrained(folder)`, logs nothing
    (AutoTokenizer logs transformers' "You are using a model of type `chargpt`..." line: it loads the folder's config
    first, and without the model's code transformers knows no `chargpt`), gives AutoTokenizer's ids and carries the
    folder's chat template."""
    import json

    from gpt_serve.models import model_path
    from tests.conftest import run_without_gpt_serve

    folder = str(model_path("shakespeare"))
    script = f"""
        import json, sys
        from transformers import PreTrainedTokenizerFast

        tok = PreTrainedTokenizerFast.from_pretrained({folder!r})
        batch = tok(["ROMEO:", "JULIET: O"], padding=True)
        prompt = tok.apply_chat_template([{{"role": "user", "content": "Good morrow."}}], tokenize=False,
                                         add_generation_prompt=True)
        sys.stderr.flush()
        print("RESULT " + json.dumps([batch.input_ids[0], tok.decode(batch.input_ids[1], skip_special_tokens=True),
                                      prompt]))
    """
    result = run_without_gpt_serve(script, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""
    (line,) = [line.removeprefix("RESULT ") for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert json.loads(line) == [[65, 65, 65, 30, 27, 25, 17, 27, 10], "JULIET: O", "ROMEO:\nGood morrow.\n\nJULIET:\n"]
