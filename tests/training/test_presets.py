"""The ladder presets are the lesson's models: checked against lesson-style reference modules written here.

The references follow the lesson's code stage by stage (separate `Head` modules, `torch.cat` of heads, the
feed-forward as its own module, `Block`s). Each stage must match our config in parameter count and, with the
reference's weights copied into ours, in output logits.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpt_serve import CharGPTConfig, CharGPTForCausalLM
from training.presets import LADDER_STAGES, PRESETS, get_preset

VOCAB, BLOCK, N_EMBD = 65, 8, 32


class Head(nn.Module):
    def __init__(self, head_size):
        super().__init__()
        self.key = nn.Linear(N_EMBD, head_size, bias=False)
        self.query = nn.Linear(N_EMBD, head_size, bias=False)
        self.value = nn.Linear(N_EMBD, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(BLOCK, BLOCK)))

    def forward(self, x):
        B, T, C = x.shape
        k, q = self.key(x), self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        return F.softmax(wei, dim=-1) @ self.value(x)


class MultiHeadAttention(nn.Module):
    def __init__(self, num_heads, head_size, proj):
        super().__init__()
        self.heads = nn.ModuleList([Head(head_size) for _ in range(num_heads)])
        self.proj = nn.Linear(N_EMBD, N_EMBD) if proj else None

    def forward(self, x):
        out = torch.cat([h(x) for h in self.heads], dim=-1)
        return self.proj(out) if self.proj is not None else out


class FeedForwardC(nn.Module):  # stage C: Linear -> ReLU
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(N_EMBD, N_EMBD), nn.ReLU())

    def forward(self, x):
        return self.net(x)


class FeedForward(nn.Module):  # stage D on: 4x wide, projected back
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD), nn.ReLU(), nn.Linear(4 * N_EMBD, N_EMBD))

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    def __init__(self, n_head, layer_norm):
        super().__init__()
        self.sa = MultiHeadAttention(n_head, N_EMBD // n_head, proj=True)
        self.ffwd = FeedForward()
        self.ln1 = nn.LayerNorm(N_EMBD) if layer_norm else nn.Identity()
        self.ln2 = nn.LayerNorm(N_EMBD) if layer_norm else nn.Identity()

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        return x + self.ffwd(self.ln2(x))


class LessonModel(nn.Module):
    """The lesson's BigramLanguageModel as it grows through stages A-E."""

    def __init__(self, stage: str):
        super().__init__()
        self.stage = stage
        self.token_embedding_table = nn.Embedding(VOCAB, N_EMBD)
        self.position_embedding_table = nn.Embedding(BLOCK, N_EMBD)
        if stage == "a":
            self.sa_head = MultiHeadAttention(1, N_EMBD, proj=False)  # the lesson's `Head(n_embd)`
        elif stage in ("b", "c"):
            self.sa_head = MultiHeadAttention(4, N_EMBD // 4, proj=True)  # the B: with a projection
            self.ffwd = FeedForwardC() if stage == "c" else None
        else:
            self.blocks = nn.Sequential(*[Block(4, layer_norm=stage == "e") for _ in range(3)])
            self.ln_f = nn.LayerNorm(N_EMBD) if stage == "e" else nn.Identity()
        self.lm_head = nn.Linear(N_EMBD, VOCAB)

    def forward(self, idx):
        B, T = idx.shape
        x = self.token_embedding_table(idx) + self.position_embedding_table(torch.arange(T))
        if self.stage in ("a", "b", "c"):
            x = self.sa_head(x)
            if self.stage == "c":
                x = self.ffwd(x)
        else:
            x = self.ln_f(self.blocks(x))
        return self.lm_head(x)


def _copy_attention(ours, ref: MultiHeadAttention):
    """Our fused qkv holds [query of every head; key of every head; value of every head] in rows."""
    q = torch.cat([h.query.weight for h in ref.heads])
    k = torch.cat([h.key.weight for h in ref.heads])
    v = torch.cat([h.value.weight for h in ref.heads])
    ours.qkv.weight.copy_(torch.cat([q, k, v]))
    if ref.proj is not None:
        ours.proj.load_state_dict(ref.proj.state_dict())


@torch.no_grad()
def copy_lesson_weights(model: CharGPTForCausalLM, ref: LessonModel) -> None:
    model.model.token_embedding_table.load_state_dict(ref.token_embedding_table.state_dict())
    model.model.position_embedding_table.load_state_dict(ref.position_embedding_table.state_dict())
    model.lm_head.load_state_dict(ref.lm_head.state_dict())
    if ref.stage in ("a", "b", "c"):
        _copy_attention(model.model.blocks[0].sa, ref.sa_head)
        if ref.stage == "c":
            model.model.blocks[0].ffwd.net[0].load_state_dict(ref.ffwd.net[0].state_dict())
        return
    for ours, theirs in zip(model.model.blocks, ref.blocks, strict=True):
        _copy_attention(ours.sa, theirs.sa)
        ours.ffwd.net[0].load_state_dict(theirs.ffwd.net[0].state_dict())
        ours.ffwd.net[2].load_state_dict(theirs.ffwd.net[2].state_dict())
        if ref.stage == "e":
            ours.ln1.load_state_dict(theirs.ln1.state_dict())
            ours.ln2.load_state_dict(theirs.ln2.state_dict())
    if ref.stage == "e":
        model.model.ln_f.load_state_dict(ref.ln_f.state_dict())


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def ladder_model(name: str) -> CharGPTForCausalLM:
    return CharGPTForCausalLM(CharGPTConfig(vocab_size=VOCAB, **get_preset(name).model)).eval()


@pytest.mark.parametrize("stage", list("abcde"))
def test_ladder_stage_has_the_lessons_parameter_count(stage):
    assert n_params(ladder_model(f"ladder-{stage}")) == n_params(LessonModel(stage))


@pytest.mark.parametrize("stage", list("abcde"))
def test_ladder_stage_computes_what_the_lessons_model_computes(stage):
    torch.manual_seed(0)
    ref = LessonModel(stage).eval()
    ours = ladder_model(f"ladder-{stage}")
    copy_lesson_weights(ours, ref)
    idx = torch.randint(VOCAB, (3, BLOCK))
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=idx, use_cache=False).logits, ref(idx), rtol=1e-5, atol=1e-5)


def test_reference_tells_stages_apart():
    """The parity check can fail: every stage has its own count, and B != C in output."""
    assert n_params(LessonModel("b")) - n_params(LessonModel("a")) == 32 * 32 + 32  # the output projection
    counts = [n_params(LessonModel(s)) for s in "abcde"]
    assert len(set(counts)) == len(counts)
    torch.manual_seed(0)
    ref_c = LessonModel("c").eval()
    ours_b = ladder_model("ladder-b")
    with torch.no_grad():
        _copy_attention(ours_b.model.blocks[0].sa, ref_c.sa_head)
        ours_b.model.token_embedding_table.load_state_dict(ref_c.token_embedding_table.state_dict())
        ours_b.model.position_embedding_table.load_state_dict(ref_c.position_embedding_table.state_dict())
        ours_b.lm_head.load_state_dict(ref_c.lm_head.state_dict())
        idx = torch.randint(VOCAB, (2, BLOCK))
        assert not torch.allclose(ours_b(input_ids=idx, use_cache=False).logits, ref_c(idx), atol=1e-3)


def test_ladder_presets_use_the_lessons_hyperparameters():
    for name in LADDER_STAGES[:5]:
        p = get_preset(name)
        assert p.model["block_size"] == 8 and p.model["n_embd"] == 32 and p.model["dropout"] == 0.0
        assert p.model["init"] == "pytorch"  # the lesson's stages A-E used PyTorch's default init
        assert p.train["batch_size"] == 32 and p.train["learning_rate"] == 1e-3 and p.train["max_iters"] == 5000
        assert p.train["eval_iters"] == 200 and p.train.get("schedule", "constant") == "constant"
    assert [get_preset(n).lesson_val_loss for n in LADDER_STAGES] == [2.4, 2.28, 2.24, 2.08, 2.06, 1.48]


def test_stage_f_is_the_lessons_scaled_model():
    p = get_preset("ladder-f")
    assert p.model == dict(block_size=256, n_embd=384, n_head=6, n_layer=6, dropout=0.2, init="normal")
    assert (p.train["batch_size"], p.train["learning_rate"], p.train["max_iters"]) == (64, 3e-4, 5000)
    model = CharGPTForCausalLM(CharGPTConfig(vocab_size=VOCAB, **p.model))
    assert round(n_params(model) / 1e6, 1) == 10.8  # the lesson prints "10.788929 M parameters"


def test_every_preset_is_documented_and_valid():
    for name, p in PRESETS.items():
        assert p.name == name and p.description and p.adds
        CharGPTConfig(vocab_size=VOCAB, **p.model)


def test_unknown_preset_names_the_choices():
    with pytest.raises(ValueError, match="ladder-a"):
        get_preset("ladder-z")
