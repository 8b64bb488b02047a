"""CharGPTForCausalLM: causality, the KV cache (inside and past block_size), padding, saving, Auto classes."""

import pytest
import torch
from conftest import make_tiny_model
from lesson_reference import full_recompute_generate
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer, pipeline

from gpt_serve import CharGPTConfig, CharGPTForCausalLM, CharTokenizer
from gpt_serve.generation.sampling import SamplingParams
from tests.conftest import run_without_gpt_serve

GREEDY = SamplingParams(temperature=0)


def test_causality_later_tokens_do_not_change_earlier_logits(tiny_model):
    x = torch.randint(0, 65, (2, 12))
    y = x.clone()
    y[:, 8:] = (y[:, 8:] + 7) % 65
    a = tiny_model(x, use_cache=False).logits
    b = tiny_model(y, use_cache=False).logits
    torch.testing.assert_close(a[:, :8], b[:, :8], rtol=0, atol=1e-6)
    assert not torch.allclose(a[:, 8:], b[:, 8:])


def test_incremental_forward_with_cache_matches_full_forward(tiny_model):
    x = torch.randint(0, 65, (1, 12))
    full = tiny_model(x, use_cache=False).logits
    out = tiny_model(x[:, :5], use_cache=True)
    step = tiny_model(x[:, 5:9], cache=out.cache, use_cache=True)  # a multi-token chunk on top of a cache
    last = tiny_model(x[:, 9:], cache=step.cache, use_cache=True)
    torch.testing.assert_close(torch.cat([out.logits, step.logits, last.logits], 1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window_mode", ["exact", "refill"])
def test_generate_cached_equals_uncached_equals_naive_across_block_size(tiny_model, window_mode):
    prompt = [18, 47, 56, 57, 58]
    n = 3 * tiny_model.config.block_size  # well past the 16-token window
    naive = full_recompute_generate(tiny_model, prompt, n, GREEDY, window_mode=window_mode)
    x = torch.tensor([prompt])
    cached = tiny_model.generate(x, max_new_tokens=n, do_sample=False, window_mode=window_mode)[0, 5:].tolist()
    assert cached == naive
    if window_mode == "exact":  # without a cache there is nothing to refill: always the exact window
        uncached = tiny_model.generate(x, max_new_tokens=n, do_sample=False, use_cache=False)[0, 5:].tolist()
        assert uncached == naive


def test_prompt_longer_than_block_size(tiny_model):
    prompt = torch.randint(0, 65, (40,)).tolist()
    naive = full_recompute_generate(tiny_model, prompt, 20, GREEDY)
    assert tiny_model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)[0, 40:].tolist() == naive


def test_left_padded_batch_equals_single_prompts(tiny_model, tokenizer):
    prompts = ["First Citizen:", "ROMEO:", "O"]
    batch = tokenizer(prompts, padding=True, return_tensors="pt")
    n = 30  # crosses block_size (16) for every row
    # exact: every row gets its own window (in refill mode a shared cache restarts every row at once)
    kwargs = dict(max_new_tokens=n, do_sample=False, window_mode="exact")
    out = tiny_model.generate(**batch, pad_token_id=tokenizer.pad_token_id, **kwargs)
    for row, prompt in zip(out, prompts):
        single = tiny_model.generate(**tokenizer(prompt, return_tensors="pt"), **kwargs)
        assert row[-n:].tolist() == single[0, -n:].tolist()
    assert not torch.isnan(tiny_model(**batch, use_cache=False).logits).any()  # fully masked pad rows stay finite


def test_labels_give_the_mean_shifted_cross_entropy(tiny_model):
    x = torch.randint(0, 65, (3, 10))
    out = tiny_model(x, labels=x, use_cache=False)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 65), x[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected, rtol=1e-6, atol=1e-6)


def test_bf16_autocast_forward_and_backward_stay_close_to_fp32(tiny_model):
    """The training precision on CUDA, run on CPU: bf16 autocast over a left-padded batch, forward and backward."""
    x = torch.randint(0, 65, (3, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(x)
    mask[1, :5] = 0
    mask[2, :15] = 0

    def run(bf16: bool):
        tiny_model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = tiny_model(x, attention_mask=mask, labels=x, use_cache=False)
        out.loss.backward()
        return out.logits, {name: p.grad.clone() for name, p in tiny_model.named_parameters()}

    logits32, grads32 = run(False)
    logits16, grads16 = run(True)
    assert logits16.dtype == torch.bfloat16  # autocast did run the matmuls in bf16
    real = mask.bool()
    # bf16 keeps 8 bits of mantissa (~0.4% relative); these logits are of order 0.5
    torch.testing.assert_close(logits16.float()[real], logits32[real], rtol=0, atol=2e-2)
    for name, grad in grads16.items():
        assert grad.dtype == torch.float32 and torch.isfinite(grad).all(), name
        assert float((grad - grads32[name]).norm() / grads32[name].norm()) < 0.1, name


def test_attention_weights_are_causal_and_normalised(tiny_model):
    x = torch.randint(0, 65, (2, 10))
    out = tiny_model(x, output_attentions=True, output_hidden_states=True, use_cache=False)
    assert len(out.attentions) == 2 and len(out.hidden_states) == 3
    for wei in out.attentions:
        assert wei.shape == (2, 4, 10, 10)
        torch.testing.assert_close(wei.sum(-1), torch.ones(2, 4, 10), rtol=1e-5, atol=1e-5)
        assert torch.equal(wei.triu(1), torch.zeros_like(wei))
    torch.testing.assert_close(out.logits, tiny_model(x, use_cache=False).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("init", ["normal", "pytorch"])
def test_init_schemes(init):
    model = make_tiny_model(init=init, n_embd=64)
    w = model.model.blocks[0].ffwd.net[0].weight
    if init == "normal":
        assert abs(w.std().item() - 0.02) < 0.003 and model.lm_head.bias.abs().max() == 0
    else:  # kaiming-uniform: bound 1/sqrt(fan_in) = 0.125, std = bound / sqrt(3)
        assert abs(w.std().item() - 0.125 / 3**0.5) < 0.01 and model.lm_head.bias.abs().max() > 0


def test_bad_forward_inputs_are_named(tiny_model):
    with pytest.raises(ValueError, match=r"ids \[70\] outside the vocabulary \[0, 64\]"):
        tiny_model(torch.tensor([[1, 70]]))
    with pytest.raises(ValueError, match="positions must lie in \\[0, block_size\\) = \\[0, 16\\)"):
        tiny_model(torch.zeros(1, 17, dtype=torch.long))
    with pytest.raises(ValueError, match="the input is empty"):
        tiny_model(torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        tiny_model(torch.zeros(1, 2, dtype=torch.long), inputs_embeds=torch.zeros(1, 2, 32))
    with pytest.raises(ValueError, match="exactly one of input_ids and inputs_embeds"):
        tiny_model()
    with pytest.raises(ValueError, match="attention_mask must have shape"):
        tiny_model(torch.zeros(1, 3, dtype=torch.long), attention_mask=torch.ones(1, 4))


def test_save_and_load_give_identical_logits(tmp_path, tiny_model):
    tiny_model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and (tmp_path / "generation_config.json").exists()
    again = CharGPTForCausalLM.from_pretrained(tmp_path).eval()
    x = torch.randint(0, 65, (2, 16))
    torch.testing.assert_close(again(x).logits, tiny_model(x).logits, rtol=0, atol=0)


def test_auto_classes_load_a_saved_folder(tiny_model_dir):
    assert type(AutoConfig.from_pretrained(tiny_model_dir)) is CharGPTConfig
    assert type(AutoModelForCausalLM.from_pretrained(tiny_model_dir)) is CharGPTForCausalLM
    assert type(AutoTokenizer.from_pretrained(tiny_model_dir)) is CharTokenizer


def test_pipeline_and_streamer(tiny_model_dir):
    generator = pipeline("text-generation", model=str(tiny_model_dir), device="cpu")
    text = generator("ROMEO:", max_new_tokens=20, do_sample=False)[0]["generated_text"]
    assert text.startswith("ROMEO:") and len(text) == len("ROMEO:") + 20

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    streamer = TextIteratorStreamer(tok, skip_prompt=True)
    ids = tok("ROMEO:", return_tensors="pt").input_ids
    full = model.generate(ids, max_new_tokens=40, do_sample=False, streamer=streamer)
    assert "".join(streamer) == tok.decode(full[0, ids.shape[1] :])


def test_sampling_options_and_seed_reproducibility(tiny_model):
    x = torch.tensor([[18, 47, 56]])
    kwargs = dict(max_new_tokens=40, do_sample=True, temperature=0.8, top_k=20, top_p=0.9, repetition_penalty=1.2)
    torch.manual_seed(3)
    a = tiny_model.generate(x, **kwargs)
    torch.manual_seed(3)
    b = tiny_model.generate(x, **kwargs)
    assert torch.equal(a, b) and a.shape == (1, 43)


def test_stopping_on_a_token(tiny_model):
    x = torch.tensor([[18, 47, 56]])
    greedy = tiny_model.generate(x, max_new_tokens=30, do_sample=False)[0, 3:].tolist()
    stop = greedy[4]
    out = tiny_model.generate(x, max_new_tokens=30, do_sample=False, eos_token_id=stop)[0, 3:].tolist()
    assert out == greedy[: greedy.index(stop) + 1]


def test_trust_remote_code_without_gpt_serve_installed(tmp_path, tiny_model_dir, tiny_model):
    """A fresh process that cannot import gpt_serve loads the folder from its own module files."""
    expected = tiny_model.generate(torch.tensor([[18, 47, 56]]), max_new_tokens=25, do_sample=False)[0].tolist()
    script = f"""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r}, trust_remote_code=True)
        tok = AutoTokenizer.from_pretrained({str(tiny_model_dir)!r}, trust_remote_code=True)
        assert "gpt_serve" not in sys.modules
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        out = model.generate(torch.tensor([[18, 47, 56]]), max_new_tokens=25, do_sample=False)
        print(out[0].tolist())
        print(tok.decode(out[0]))
    """
    result = run_without_gpt_serve(script, tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[0] == str(expected)


def test_shipped_folders_hold_data_only():
    """The shipped folders carry no code and no `auto_map`: the package's modules are the only copy."""
    import json

    from gpt_serve.models import list_models, model_path

    assert "shakespeare" in list_models()
    for name in list_models():
        folder = model_path(name)
        assert not list(folder.rglob("*.py")), name
        for config in ("config.json", "tokenizer_config.json"):
            assert "auto_map" not in json.loads((folder / config).read_text()), (name, config)


def test_save_pretrained_writes_the_remote_code_bundle(tmp_path, tiny_model, tokenizer):
    tiny_model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    bundle = sorted(p.name for p in tmp_path.glob("*.py"))
    # the model, its config and its limits, and the window rule it shares with the scheduler; the tokenizer is
    # tokenizer.json
    assert bundle == ["config_limits.py", "configuration_chargpt.py", "modeling_chargpt.py", "window.py"]


def test_window_mode_is_a_generation_argument(tiny_model):
    x = torch.tensor([[18, 47, 56]])
    assert not hasattr(tiny_model.config, "window_mode") and "window_mode" not in tiny_model.config.to_dict()
    with pytest.raises(ValueError, match="window_mode must be one of"):
        tiny_model.generate(x, max_new_tokens=20, do_sample=False, window_mode="slide")
    with pytest.raises(
        ValueError, match=r"refill_tokens must be an integer in \[1, block_size - 1\] = \[1, 15\], got 16"
    ):
        tiny_model.generate(x, max_new_tokens=20, do_sample=False, window_mode="refill", refill_tokens=16)
    n = 40
    naive = full_recompute_generate(tiny_model, [18, 47, 56], n, GREEDY, window_mode="refill", refill_tokens=5)
    out = tiny_model.generate(x, max_new_tokens=n, do_sample=False, window_mode="refill", refill_tokens=5)
    assert out[0, 3:].tolist() == naive


def test_window_modes_agree_with_the_generation_engine():
    from gpt_serve.chargpt.modeling_chargpt import WINDOW_MODES as MODEL_WINDOW_MODES
    from gpt_serve.generation import WINDOW_MODES

    assert MODEL_WINDOW_MODES == WINDOW_MODES


# nanoGPT's variant, and every switch off its default at once (the importer's other architectures)
SWITCHES = dict(
    activation="gelu", bias=False, qkv_bias=True, lm_head_bias=False, layer_norm_bias=False,
    tie_word_embeddings=True, attn_scale="n_embd",
)  # fmt: skip


def test_the_switches_build_what_they_say():
    model = make_tiny_model(seed=1, **SWITCHES)
    block = model.model.blocks[0]
    assert isinstance(block.ffwd.net[1], torch.nn.GELU) and block.ffwd.net[1].approximate == "none"
    assert block.sa.qkv.bias is not None and block.sa.proj.bias is None and block.ffwd.net[0].bias is None
    assert block.ln1.bias is None and model.model.ln_f.bias is None and model.lm_head.bias is None
    assert model.lm_head.weight is model.model.token_embedding_table.weight
    assert block.sa.scaling == 32**-0.5  # n_embd, not head_size 8
    default = make_tiny_model(seed=1)
    assert (
        isinstance(default.model.blocks[0].ffwd.net[1], torch.nn.ReLU) and default.model.blocks[0].sa.qkv.bias is None
    )
    assert default.lm_head.bias is not None and default.lm_head.weight is not default.model.token_embedding_table.weight
    assert default.model.blocks[0].sa.scaling == 8**-0.5


def test_the_switched_model_caches_pads_and_saves_like_the_default(tmp_path, tokenizer):
    from gpt_serve.generation import generate_tokens
    from gpt_serve.generation.backends.torch_backend import TorchBackend

    model = make_tiny_model(seed=1, **SWITCHES)
    with torch.no_grad():  # off their init (zero biases, unit LayerNorms)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    x = torch.randint(0, 65, (1, 12))
    full = model(x, use_cache=False).logits
    out = model(x[:, :5], use_cache=True)
    rest = model(x[:, 5:], cache=out.cache, use_cache=True)
    torch.testing.assert_close(torch.cat([out.logits, rest.logits], 1), full, rtol=1e-5, atol=1e-5)
    model.save_pretrained(tmp_path)
    from safetensors import safe_open

    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys()  # tied: one tensor, saved once
    again = CharGPTForCausalLM.from_pretrained(tmp_path).eval()
    assert again.lm_head.weight is again.model.token_embedding_table.weight
    torch.testing.assert_close(again(x).logits, full, rtol=0, atol=0)
    eager = CharGPTForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    torch.testing.assert_close(eager(x).logits, full, rtol=1e-5, atol=1e-5)
    prompt = [18, 47, 56]  # the engine's decode path (its own Linear and attention) past block_size
    tokens = [int(t[0]) for t in generate_tokens(TorchBackend(model), [prompt], 40, GREEDY, window_mode="exact")]
    assert tokens == full_recompute_generate(model, prompt, 40, GREEDY, window_mode="exact")
