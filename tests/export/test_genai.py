"""onnxruntime-genai runs the exported folder: `onnx/genai_config.json` and its tokenizer, written by the export."""

from __future__ import annotations

import json
import shutil

import pytest

from export.genai import GENAI_CONFIG_FILE_NAME, genai_search, genai_tokenizer, rarest_id, write_genai_tokenizer
from gpt_serve.chargpt.vocab import CharVocab
from gpt_serve.generation import SamplingParams, generate_text, load_backend
from gpt_serve.generation.folder_defaults import read_generation_defaults
from gpt_serve.models import list_models, model_path
from tests.helpers import genai_greedy

# Spaces, newlines and punctuation: the characters the first BPE-form tokenizer encoded as -1 or crashed on.
MIXED = "a b\nc d, e"
UNKNOWN = ["é", "a€ b😀c", "\tcafé\r\n", "<pad>"]  # 2-, 3- and 4-byte characters, ASCII outside the vocabulary


def genai():
    return pytest.importorskip(
        "onnxruntime_genai", reason="onnxruntime-genai is not installed (pip install onnxruntime-genai)"
    )


@pytest.fixture(scope="module")
def shakespeare_tokenizer():
    og = genai()
    return og.Tokenizer(og.Model(str(model_path("shakespeare") / "onnx")))


def encode(tokenizer, text: str) -> list[int]:
    return [int(i) for i in tokenizer.encode(text)]


def stream_decode(tokenizer, ids: list[int]) -> str:
    stream = tokenizer.create_stream()
    return "".join(stream.decode(i) for i in ids)


def test_the_export_writes_genai_files_that_describe_the_graph(exported_dir):
    from gpt_serve import CharGPTConfig

    config = CharGPTConfig.from_pretrained(exported_dir)
    settings = json.loads((exported_dir / "onnx" / GENAI_CONFIG_FILE_NAME).read_text())
    model = settings["model"]
    assert model["decoder"]["filename"] == "model_quantized.onnx"
    assert (model["vocab_size"], model["context_length"]) == (config.vocab_size, config.block_size)
    assert model["decoder"]["head_size"] * model["decoder"]["num_attention_heads"] == config.n_embd
    assert 0 <= model["eos_token_id"] < config.vocab_size
    vocab = CharVocab.from_file(exported_dir / "vocab.json")
    assert json.loads((exported_dir / "onnx" / "tokenizer.json").read_text("utf-8")) == genai_tokenizer(vocab)


@pytest.mark.parametrize(
    ("defaults", "search"),
    [
        ({}, dict(do_sample=True, temperature=1.0, top_k=65, top_p=1.0)),  # the lesson's
        (dict(temperature=0.8, top_k=0, top_p=1.0), dict(do_sample=True, temperature=0.8, top_k=65, top_p=1.0)),
        (dict(temperature=0.5, top_k=5, top_p=0.9), dict(do_sample=True, temperature=0.5, top_k=5, top_p=0.9)),
        (dict(temperature=0.0), dict(do_sample=False, temperature=1.0, top_k=65, top_p=1.0)),  # greedy
        (dict(top_k=200), dict(do_sample=True, temperature=1.0, top_k=65, top_p=1.0)),  # past the vocabulary: all
    ],
)
def test_genai_samples_with_the_folder_s_defaults(defaults, search):
    from gpt_serve import CharGPTConfig

    assert genai_search(CharGPTConfig(vocab_size=65), defaults) == search


def test_the_export_writes_the_folder_s_sampling_into_genai_config(exported_dir):
    from gpt_serve import CharGPTConfig

    settings = json.loads((exported_dir / "onnx" / GENAI_CONFIG_FILE_NAME).read_text())
    config, defaults = CharGPTConfig.from_pretrained(exported_dir), read_generation_defaults(exported_dir)
    assert settings["search"] == {**settings["search"], **genai_search(config, defaults)}


def test_an_export_of_a_folder_with_a_bad_generation_config_names_it(exported_dir, tmp_path):
    from export.exporter import WORK_PREFIX, export_model

    folder = shutil.copytree(exported_dir, tmp_path / "model")
    (folder / "generation_config.json").write_text('{"temperature": -1}')
    with pytest.raises(ValueError, match=r"generation_config.json: .*temperature"):
        export_model(folder, quantize=False)
    assert not list(folder.glob(WORK_PREFIX + "*"))  # refused before any work


@pytest.mark.parametrize("name", list_models())
def test_every_shipped_genai_config_samples_as_the_folder_says(name):
    from gpt_serve import CharGPTConfig

    folder = model_path(name)
    search = json.loads((folder / "onnx" / GENAI_CONFIG_FILE_NAME).read_text())["search"]
    want = genai_search(CharGPTConfig.from_pretrained(folder), read_generation_defaults(folder))
    assert search == {**search, **want} and search["temperature"] == 0.8  # generation_config.json's


@pytest.mark.parametrize("name", list_models())
def test_every_shipped_folder_has_the_tokenizer_the_writer_writes_now(name):
    folder = model_path(name)
    want = genai_tokenizer(CharVocab.from_file(folder / "vocab.json"))
    assert json.loads((folder / "onnx" / "tokenizer.json").read_text("utf-8")) == want


def test_the_eos_id_is_the_rarest_character_of_the_training_text(corpus):
    vocab = CharVocab.from_file(model_path("shakespeare") / "vocab.json")
    assert vocab.chars[rarest_id(vocab, corpus)] == "$"  # once in Tiny Shakespeare
    assert rarest_id(vocab, None) == len(vocab) - 1


def test_genai_encodes_every_vocabulary_character_to_its_id(shakespeare_tokenizer):
    vocab = CharVocab.from_file(model_path("shakespeare") / "vocab.json")
    assert len(vocab) == 65 and {"\n", " "} <= set(vocab.chars)
    for i, c in enumerate(vocab.chars):
        assert encode(shakespeare_tokenizer, c) == [i], repr(c)
        assert shakespeare_tokenizer.decode([i]) == c
    every = "".join(vocab.chars)
    assert encode(shakespeare_tokenizer, every) == list(range(len(vocab)))
    assert shakespeare_tokenizer.decode(list(range(len(vocab)))) == every
    assert stream_decode(shakespeare_tokenizer, list(range(len(vocab)))) == every


def test_genai_encodes_text_with_spaces_newlines_and_punctuation_as_we_do(shakespeare_tokenizer, corpus):
    vocab = CharVocab.from_file(model_path("shakespeare") / "vocab.json")
    start = corpus.index("ROMEO:")
    for text in [MIXED, "  two  spaces\n\n\nand blank lines ", corpus[:400], corpus[start : start + 400]]:
        ids = encode(shakespeare_tokenizer, text)
        assert ids == vocab.encode(text), repr(text)
        assert shakespeare_tokenizer.decode(ids) == text
        assert stream_decode(shakespeare_tokenizer, ids) == text


@pytest.mark.parametrize("text", UNKNOWN)
def test_genai_replaces_each_unknown_character_with_one_space(shakespeare_tokenizer, text):
    vocab = CharVocab.from_file(model_path("shakespeare") / "vocab.json")
    ids = encode(shakespeare_tokenizer, text)
    assert ids == vocab.encode(text, unk_policy="replace")  # the core's opt-in policy, not a crash or -1
    assert shakespeare_tokenizer.decode(ids) == vocab.clean(text, unk_policy="replace")


def test_genai_reads_multi_byte_vocabulary_characters_and_another_replacement(tmp_path):
    og = genai()
    shakespeare = CharVocab.from_file(model_path("shakespeare") / "vocab.json")
    cases = [CharVocab([*shakespeare.chars, *"éè—😀"]), CharVocab([c for c in shakespeare.chars if c != " "])]
    for n, vocab in enumerate(cases):
        folder = shutil.copytree(model_path("shakespeare") / "onnx", tmp_path / str(n), ignore=ignore_extra_graphs)
        write_genai_tokenizer(folder, vocab)
        tokenizer = og.Tokenizer(og.Model(str(folder)))
        for text in ["café è—😀 x", "ã€ b\n", MIXED]:
            ids = encode(tokenizer, text)
            assert ids == vocab.encode(text, unk_policy="replace"), (vocab.unk_replacement, text)
            assert tokenizer.decode(ids) == vocab.clean(text, unk_policy="replace")


def ignore_extra_graphs(folder, names):
    return [name for name in names if name.endswith(".onnx") and name != "model_quantized.onnx"]


def test_tokenizers_reads_the_genai_file_with_the_same_ids():
    """The file is genai's, but the `tokenizers` library agrees with it for an ASCII vocabulary (the shipped one)."""
    from tokenizers import Tokenizer

    folder = model_path("shakespeare")
    vocab = CharVocab.from_file(folder / "vocab.json")
    tokenizer = Tokenizer.from_file(str(folder / "onnx" / "tokenizer.json"))
    for text in [MIXED, "".join(vocab.chars), *UNKNOWN]:
        ids = tokenizer.encode(text).ids
        assert ids == vocab.encode(text, unk_policy="replace"), repr(text)
        assert tokenizer.decode(ids) == vocab.clean(text, unk_policy="replace")


@pytest.mark.parametrize(
    ("name", "prompt"),
    [("shakespeare", "ROMEO:"), ("ladder-d", "ROMEO:"), ("shakespeare", MIXED), ("ladder-d", MIXED[:5])],
)  # ladder-d's window (block_size) is 8 characters
def test_onnxruntime_genai_gives_our_greedy_text_inside_the_window(name, prompt):
    og = genai()
    folder = model_path(name)
    loaded = load_backend(name, "onnx-int8", threads=1)
    n = loaded.block_size - len(prompt)  # genai stops at block_size
    want = generate_text(loaded.backend, loaded.vocab, prompt, n, SamplingParams(temperature=0.0))

    model = og.Model(str(folder / "onnx"))
    tokenizer = og.Tokenizer(model)
    ids = encode(tokenizer, prompt)
    assert ids == loaded.vocab.encode(prompt)
    out = genai_greedy(og, model, ids, loaded.block_size)
    assert tokenizer.decode(out) == want and len(out) == n
