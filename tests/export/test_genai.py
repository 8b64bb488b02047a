"""onnxruntime-genai runs the exported folder: `onnx/genai_config.json` and its tokenizer, written by the export."""

from __future__ import annotations

import json

import pytest

from export.genai import GENAI_CONFIG_FILE_NAME, rarest_id
from gpt_serve.generation import SamplingParams, generate_text, load_backend
from gpt_serve.models import model_path
from gpt_serve.vocab import CharVocab


def test_the_export_writes_genai_files_that_describe_the_graph(exported_dir):
    from gpt_serve import CharGPTConfig

    config = CharGPTConfig.from_pretrained(exported_dir)
    settings = json.loads((exported_dir / "onnx" / GENAI_CONFIG_FILE_NAME).read_text())
    model = settings["model"]
    assert model["decoder"]["filename"] == "model_quantized.onnx"
    assert (model["vocab_size"], model["context_length"]) == (config.vocab_size, config.block_size)
    assert model["decoder"]["head_size"] * model["decoder"]["num_attention_heads"] == config.n_embd
    assert 0 <= model["eos_token_id"] < config.vocab_size
    assert (exported_dir / "onnx" / "tokenizer.json").is_file()


def test_the_eos_id_is_the_rarest_character_of_the_training_text(corpus):
    vocab = CharVocab.from_text(corpus)
    assert vocab.chars[rarest_id(vocab, corpus)] == "$"  # once in Tiny Shakespeare
    assert rarest_id(vocab, None) == len(vocab) - 1


@pytest.mark.parametrize("name", ["shakespeare", "ladder-d"])
def test_onnxruntime_genai_gives_our_greedy_tokens_inside_the_window(name):
    og = pytest.importorskip(
        "onnxruntime_genai", reason="onnxruntime-genai is not installed (pip install onnxruntime-genai)"
    )
    folder = model_path(name)
    loaded = load_backend(name, "onnx-int8", threads=1)
    prompt = "ROMEO:"
    n = loaded.block_size - len(prompt)  # genai stops at block_size
    want = generate_text(loaded.backend, loaded.vocab, prompt, n, SamplingParams(temperature=0.0))

    model = og.Model(str(folder / "onnx"))
    tokenizer = og.Tokenizer(model)
    ids = [int(i) for i in tokenizer.encode(prompt)]
    assert ids == loaded.vocab.encode(prompt)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=loaded.block_size)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    out = []
    while not generator.is_done():
        generator.generate_next_token()
        out.append(int(generator.get_next_tokens()[0]))
    assert tokenizer.decode(out) == want and len(out) == n
