"""The contract transformers' own models keep, kept by `CharGPTForCausalLM`: masks from transformers' masking
utilities (padding, custom 4D masks, packed sequences), every cache class (dynamic, static and compiled, the paged
cache of continuous batching), `inputs_embeds`, the body as `AutoModel`, and folders of every age and origin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForCausalLM, GenerationConfig
from transformers.generation.configuration_utils import ContinuousBatchingConfig

from gpt_serve import CharGPTConfig, CharGPTForCausalLM, CharGPTModel
from gpt_serve.models import ONNX_FILE_NAMES
from tests.conftest import edit_json

V = 65


@pytest.fixture(scope="module")
def model() -> CharGPTForCausalLM:
    torch.manual_seed(0)
    config = CharGPTConfig(vocab_size=V, block_size=32, n_embd=32, n_head=4, n_layer=2, dropout=0.0)
    return CharGPTForCausalLM(config).eval()


def greedy(model, ids, n, **kwargs) -> torch.Tensor:
    return model.generate(ids, do_sample=False, max_new_tokens=n, **kwargs)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("use_cache", [False, None])
def test_packed_sequences_equal_the_same_sequences_run_apart(model, attention, use_cache):
    """Padding-free batches (`DataCollatorWithFlattening`): sequences in one row, positions restarting at 0."""
    model.set_attn_implementation(attention)
    try:
        torch.manual_seed(1)
        seqs = [torch.randint(0, V, (n,)) for n in (5, 9, 3, 12)]
        positions = torch.cat([torch.arange(len(s)) for s in seqs])[None]
        packed = model(torch.cat(seqs)[None], position_ids=positions, use_cache=use_cache).logits[0]
        apart = torch.cat([model(s[None], use_cache=False).logits[0] for s in seqs])
        torch.testing.assert_close(packed, apart, rtol=1e-5, atol=1e-5)
    finally:
        model.set_attn_implementation("sdpa")


@pytest.mark.parametrize("kind", ["bool", "additive"])
def test_a_custom_4d_mask_equals_the_equivalent_2d_mask(model, kind):
    torch.manual_seed(2)
    x = torch.randint(0, V, (2, 10))
    mask = torch.ones_like(x)
    mask[0, :4] = 0  # row 0 is left-padded
    allowed = torch.ones(10, 10, dtype=torch.bool).tril()[None, None] & mask.bool()[:, None, None, :]  # (B,1,T,S)
    mask4d = allowed if kind == "bool" else torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo().min)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    two = model(x, attention_mask=mask, use_cache=False).logits
    four = model(x, attention_mask=mask4d, position_ids=positions, use_cache=False).logits
    real = mask.bool()  # a padding position's logits are not defined
    torch.testing.assert_close(four[real], two[real], rtol=1e-5, atol=1e-5)


def test_static_cache_and_compiled_generation_equal_dynamic_cache_generation(model):
    """Past `block_size` too: the window slides by `cache.reset()`, whatever the cache class."""
    torch.manual_seed(3)
    x = torch.randint(0, V, (2, 7))
    n = 45  # 7 + 45 > block_size 32
    dynamic = greedy(model, x, n)
    static = greedy(model, x, n, cache_implementation="static")
    torch.testing.assert_close(static, dynamic, rtol=0, atol=0)
    compiled = CharGPTForCausalLM(model.config).eval()
    compiled.load_state_dict(model.state_dict())
    # transformers' documented recipe for compiled generation; fullgraph: a graph break raises. The eager backend
    # traces the same graphs as inductor without spending a minute of this CPU on code generation.
    compiled.forward = torch.compile(compiled.forward, fullgraph=True, backend="eager")
    torch._dynamo.reset()
    torch.testing.assert_close(greedy(compiled, x, n, cache_implementation="static"), dynamic, rtol=0, atol=0)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1


def test_generate_batch_equals_generate_for_16_requests(model):
    """transformers' continuous batching (`generate_batch`, what `transformers serve --continuous-batching` runs):
    one packed row of every request's new tokens, a 4D mask, the paged cache filled through `cache.update`'s
    kwargs."""
    torch.manual_seed(4)
    prompts = [torch.randint(0, V, (n,)).tolist() for n in range(3, 19)]
    config = GenerationConfig(max_new_tokens=10, do_sample=False, eos_token_id=-1, pad_token_id=V)
    sizes = ContinuousBatchingConfig(num_blocks=32, max_batch_tokens=256)  # no sizing from this machine's memory
    out = model.generate_batch(prompts, generation_config=config, continuous_batching_config=sizes, progress_bar=False)
    results = list(out.values())
    assert len(results) == 16
    for prompt, result in zip(prompts, results, strict=True):
        expected = greedy(model, torch.tensor([prompt]), 10)[0, len(prompt) :].tolist()
        assert result.generated_tokens == expected, result


def test_generation_from_inputs_embeds_equals_generation_from_input_ids(model):
    torch.manual_seed(5)
    x = torch.randint(0, V, (2, 6))
    embeds = model.get_input_embeddings()(x)
    for n in (20, 40):  # 6 + 40 > block_size 32: the window slides over generated tokens only
        from_ids = greedy(model, x, n)[:, 6:]
        torch.testing.assert_close(greedy(model, None, n, inputs_embeds=embeds), from_ids, rtol=0, atol=0)
    long = model.get_input_embeddings()(torch.randint(0, V, (1, 30)))
    with pytest.raises(ValueError, match="inputs_embeds cannot slide its window past block_size"):
        greedy(model, None, 10, inputs_embeds=long)  # the refilled window would hold prompt embeddings


def test_automodel_gives_the_body_and_its_hidden_states(tmp_path, model):
    model.save_pretrained(tmp_path)
    body = AutoModel.from_pretrained(tmp_path).eval()
    assert type(body) is CharGPTModel and type(model.base_model) is CharGPTModel
    x = torch.randint(0, V, (1, 8))
    out = model(x, output_hidden_states=True, output_attentions=True)
    hidden = body(x).last_hidden_state
    torch.testing.assert_close(hidden, out.hidden_states[-1])  # the last one after the final LayerNorm, as GPT-2's
    assert len(out.hidden_states) == model.config.n_layer + 1 and len(out.attentions) == model.config.n_layer
    assert out.attentions[0].shape == (1, model.config.n_head, 8, 8)


def test_a_folder_saved_before_the_body_head_split_loads(tmp_path, model):
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    old = {k.removeprefix("model."): v.contiguous() for k, v in load_file(weights).items()}
    assert "blocks.0.sa.qkv.weight" in old and "lm_head.weight" in old
    save_file(old, weights, metadata={"format": "pt"})
    x = torch.randint(0, V, (1, 8))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=0)
    body = CharGPTModel.from_pretrained(tmp_path).eval()  # the old layout is the body's own, plus lm_head
    torch.testing.assert_close(body(x).last_hidden_state, model.model(x).last_hidden_state, rtol=0, atol=0)


def test_the_shipped_folders_are_in_the_current_layout():
    from gpt_serve.models import discover

    for name, folder in discover().items():
        keys = load_file(folder / "model.safetensors").keys()
        assert all(k.startswith(("model.", "lm_head.")) for k in keys), name


PLAIN = "import sys; sys.modules['gpt_serve'] = None  # as where gpt_serve is not installed\n"


def run_python(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )


def test_autotokenizer_asks_nothing_of_a_saved_folder(tmp_path, tiny_model_dir):
    """With the package's classes registered, and with plain transformers on a data-only folder: no "Do you wish
    to run the custom code?" (the tokenizer needs no code: `tokenizer.json` holds all of it)."""
    registered = run_python(
        "import gpt_serve; gpt_serve.register_auto_classes()\nfrom transformers import AutoTokenizer\n"
        f"print(type(AutoTokenizer.from_pretrained({str(tiny_model_dir)!r})).__name__)",
        tmp_path,
    )
    assert registered.returncode == 0, registered.stderr
    assert registered.stdout.split() == ["CharTokenizer"] and "custom code" not in registered.stderr
    from gpt_serve.models import model_path

    plain = run_python(
        PLAIN + "from transformers import AutoTokenizer\n"
        f"t = AutoTokenizer.from_pretrained({str(model_path('shakespeare'))!r}); print(t('ROMEO')['input_ids'])",
        tmp_path,
    )
    assert plain.returncode == 0, plain.stderr
    assert "custom code" not in plain.stdout + plain.stderr
    assert plain.stdout.split("\n")[-2] == "[30, 27, 25, 17, 27]"


def test_a_copied_shipped_folder_loads_in_plain_transformers(tmp_path):
    """The documented route for a shipped (data-only) folder: `gpt-serve copy NAME OUT`, then `trust_remote_code`."""
    from gpt_serve.cli import main
    from gpt_serve.models import model_path

    out = tmp_path / "copy"
    assert main(["copy", "ladder-a", str(out)]) == 0
    assert {"modeling_chargpt.py", "configuration_chargpt.py", "window.py", "onnx"} <= {p.name for p in out.iterdir()}
    assert "trust_remote_code=True" in (out / "README.md").read_text()
    ours = CharGPTForCausalLM.from_pretrained(model_path("ladder-a")).eval()
    expected = greedy(ours, torch.tensor([[30, 27, 25, 17, 27]]), 12)[0].tolist()
    result = run_python(
        PLAIN + "import torch\nfrom transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True).eval()\n"
        f"t = AutoTokenizer.from_pretrained({str(out)!r}, trust_remote_code=True)\n"
        f"body = AutoModel.from_pretrained({str(out)!r}, trust_remote_code=True)\n"
        "ids = t('ROMEO', return_tensors='pt').input_ids\n"
        "print(type(body).__name__, m.generate(ids, do_sample=False, max_new_tokens=12)[0].tolist())",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == f"CharGPTModel {expected}"
    assert main(["copy", "ladder-a", str(out)]) == 2  # an existing folder is not replaced without --force


def test_copy_writes_the_model_files_only_and_says_what_it_skipped(tmp_path, capsys):
    """Issue 32: a folder with a link to a secret file, a foreign code file named by a foreign auto_map entry, and a
    pickle (and a training run's checkpoints/ and snapshots/). The copy holds none of them, its auto_map is ours
    alone, and its card's snippet imports no foreign code."""
    import dataclasses
    import json
    import os
    import shutil

    from gpt_serve.cli import main
    from gpt_serve.folders.corpus_record import read_corpus_record
    from gpt_serve.folders.snapshots import StepRecord, read_step_record, write_step_record
    from gpt_serve.models import model_path

    folder = Path(shutil.copytree(model_path("ladder-a"), tmp_path / "F"))
    secret = tmp_path / "secret.txt"
    secret.write_text("the secret")
    os.symlink(secret, folder / "notes.txt")
    os.symlink(secret, folder / "onnx" / "extra.txt")
    marker = tmp_path / "evil-ran"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass Tok: pass\n")
    for name in ("config.json", "tokenizer_config.json"):
        edit_json(folder / name, lambda c: c.update(auto_map={"AutoTokenizer": ["evil.Tok", None]}))
    (folder / "pytorch_model.bin").write_bytes(b"a pickle")
    for kept_by_training in ("checkpoints/checkpoint.pt", "snapshots/step-000100/model.safetensors"):
        (folder / kept_by_training).parent.mkdir(parents=True)
        (folder / kept_by_training).write_bytes(b"training's")
    (folder / ".lock").write_bytes(b"")
    write_step_record(folder, StepRecord(100, 2.5, 2.4))
    edit_json(folder / "corpus.json", lambda c: c.update(source=str(tmp_path / "private" / "input.txt")))
    out = tmp_path / "OUT"
    assert main(["copy", str(folder), str(out)]) == 0
    err = capsys.readouterr().err
    for name, why in [
        ("notes.txt", "a symbolic link"), ("onnx/extra.txt", "a symbolic link"), ("evil.py", "a code file"),
        ("pytorch_model.bin", "a pickle"), ("checkpoints", "training's state for resuming"),
        ("snapshots", f"the model's earlier states that training kept (--snapshots), each a model folder of its own: "
                      f"copy one with gpt-serve copy {folder}/snapshots/step-NNNNNN DEST"),
        (".lock", "training's lock"),
    ]:  # fmt: skip
        assert f"skipped {name}: {why}" in err, err
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == sorted(
        ["README.md", "added_tokens.json", "chat_template.jinja", "config.json", "config_limits.py",
         "configuration_chargpt.py", "corpus.json", "generation_config.json", "loss.png", "metrics.jsonl",
         "model.safetensors", "modeling_chargpt.py", "step.json", "tokenizer.json", "tokenizer_config.json",
         "vocab.json", "window.py"]
        + [f"onnx/{n}" for n in ONNX_FILE_NAMES]
    )  # fmt: skip
    # the model's records travel, checked; where its text lies on this machine does not
    assert read_corpus_record(out) == dataclasses.replace(read_corpus_record(folder), source=None)
    assert read_step_record(out) == StepRecord(100, 2.5, 2.4)
    assert "private" not in (out / "corpus.json").read_text()
    assert not any(p.is_symlink() for p in out.rglob("*"))
    assert not any(b"the secret" in p.read_bytes() for p in out.rglob("*") if p.is_file())
    assert json.loads((out / "config.json").read_text())["auto_map"] == {
        "AutoConfig": "configuration_chargpt.CharGPTConfig",
        "AutoModel": "modeling_chargpt.CharGPTModel",
        "AutoModelForCausalLM": "modeling_chargpt.CharGPTForCausalLM",
    }
    assert "auto_map" not in json.loads((out / "tokenizer_config.json").read_text())
    card = (out / "README.md").read_text()
    snippet = card.split("```python\n", 1)[1].split("```", 1)[0].replace("PATH", str(out))
    snippet = snippet.replace("max_new_tokens=200", "max_new_tokens=5")
    result = run_python(PLAIN + snippet, tmp_path)
    assert result.returncode == 0, result.stderr
    assert not marker.exists()


def test_importing_the_model_module_registers_the_auto_classes_and_the_config_names_its_special_ids(tmp_path):
    """As for transformers' own models: the module's classes are the Auto classes' as soon as it is imported; and the
    config declares bos/eos/pad (None: no such characters), which transformers 5's generation code reads."""
    result = run_python(
        "import gpt_serve.chargpt.modeling_chargpt\nfrom transformers import AutoModel, AutoModelForCausalLM\n"
        "from gpt_serve.chargpt.configuration_chargpt import CharGPTConfig\n"
        "c = CharGPTConfig(n_embd=32, n_head=4, n_layer=1)\n"
        "print(type(AutoModelForCausalLM.from_config(c)).__name__, type(AutoModel.from_config(c)).__name__, "
        "c.bos_token_id, c.eos_token_id, c.pad_token_id)",
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["CharGPTForCausalLM", "CharGPTModel", "None", "None", "None"]


def test_output_attentions_set_in_the_config_gives_the_weights(model):
    """transformers allows `config.output_attentions` with the eager kernel only (SDPA computes no weights)."""
    x = torch.randint(0, V, (1, 6))
    model.set_attn_implementation("eager")
    model.config.output_attentions = True
    try:
        attentions = model(x, use_cache=False).attentions
    finally:
        model.config.output_attentions = False
        model.set_attn_implementation("sdpa")
    assert len(attentions) == model.config.n_layer and all(a.shape == (1, 4, 6, 6) for a in attentions)


def test_the_copys_use_snippet_starts_from_the_models_own_prompt():
    from gpt_serve.folders.publishing import with_remote_code_use

    card = with_remote_code_use("# mine\n\n## Use\n\nOLD-USE\n\n## Sample\n", 'def f(x):\n    return "y"')
    assert 'ids = tokenizer("def f(x):\\n    return \\"y\\"", return_tensors="pt")' in card
    assert "OLD-USE" not in card and card.endswith("## Sample\n")


def test_the_copys_use_section_ends_where_the_exports_section_begins():
    """A snapshot's card ends with its Use section, and `python -m export` appends its section between markers: the
    rewrite keeps both markers, so a later export replaces that section instead of adding a second."""
    from gpt_serve.folders.publishing import with_remote_code_use

    onnx = "<!-- gpt-serve:onnx:begin (by `python -m export`) -->\n## ONNX\n\nGRAPHS\n<!-- gpt-serve:onnx:end -->\n"
    card = with_remote_code_use(f"# mine\n\n## Use\n\nOLD-USE\n\n{onnx}", "ROMEO:")
    assert "OLD-USE" not in card and card.endswith(onnx) and "trust_remote_code=True" in card
