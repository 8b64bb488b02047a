"""The two kinds of checkpoint `gpt-serve import` reads, made here from their authors' public layouts: small
reference modules with the exact parameter names of the lesson's `gpt.py` and of nanoGPT's `model.py`, trained a
few steps (so no weight is at its init) and saved the way their code saves them. Nothing of gpt_serve is used to
build them."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

# --- the lesson's gpt.py (GPTLanguageModel) ---------------------------------------------------------------------


class Head(nn.Module):
    """One head of self-attention. `scale_by`: "head_size" (the final gpt.py, `k.shape[-1]**-0.5`) or "n_embd"
    (gpt.py as typed in the video, `C**-0.5`)."""

    def __init__(self, n_embd, head_size, block_size, dropout, scale_by="head_size"):
        super().__init__()
        self.key = nn.Linear(n_embd, head_size, bias=False)
        self.query = nn.Linear(n_embd, head_size, bias=False)
        self.value = nn.Linear(n_embd, head_size, bias=False)
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))
        self.dropout = nn.Dropout(dropout)
        self.scale_by = scale_by

    def forward(self, x):
        B, T, C = x.shape
        k, q = self.key(x), self.query(x)
        scale = k.shape[-1] ** -0.5 if self.scale_by == "head_size" else C**-0.5
        wei = q @ k.transpose(-2, -1) * scale
        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))
        wei = self.dropout(F.softmax(wei, dim=-1))
        return wei @ self.value(x)


class MultiHeadAttention(nn.Module):
    def __init__(self, n_embd, num_heads, head_size, block_size, dropout, scale_by):
        super().__init__()
        self.heads = nn.ModuleList([Head(n_embd, head_size, block_size, dropout, scale_by) for _ in range(num_heads)])
        self.proj = nn.Linear(head_size * num_heads, n_embd)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.proj(torch.cat([h(x) for h in self.heads], dim=-1)))


class FeedFoward(nn.Module):  # the lesson's spelling
    def __init__(self, n_embd, dropout):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.ReLU(), nn.Linear(4 * n_embd, n_embd), nn.Dropout(dropout)
        )

    def forward(self, x):
        return self.net(x)


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout, scale_by):
        super().__init__()
        head_size = n_embd // n_head
        self.sa = MultiHeadAttention(n_embd, n_head, head_size, block_size, dropout, scale_by)
        self.ffwd = FeedFoward(n_embd, dropout)
        self.ln1 = nn.LayerNorm(n_embd)
        self.ln2 = nn.LayerNorm(n_embd)

    def forward(self, x):
        x = x + self.sa(self.ln1(x))
        return x + self.ffwd(self.ln2(x))


class GPTLanguageModel(nn.Module):
    def __init__(self, vocab_size, n_embd=32, n_head=4, n_layer=2, block_size=16, dropout=0.1, scale_by="head_size"):
        super().__init__()
        self.block_size = block_size
        self.token_embedding_table = nn.Embedding(vocab_size, n_embd)
        self.position_embedding_table = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block(n_embd, n_head, block_size, dropout, scale_by) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx):
        B, T = idx.shape
        x = self.token_embedding_table(idx) + self.position_embedding_table(torch.arange(T, device=idx.device))
        return self.lm_head(self.ln_f(self.blocks(x)))


# --- nanoGPT's model.py (GPT) -----------------------------------------------------------------------------------


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm with an optional bias."""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, bias, dropout, flash):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout, self.resid_dropout = nn.Dropout(dropout), nn.Dropout(dropout)
        self.n_head, self.n_embd, self.dropout, self.flash = n_head, n_embd, dropout, flash
        if not flash:  # nanoGPT registers the mask only where PyTorch has no scaled_dot_product_attention
            self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, -1))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.flash:
            p = self.dropout if self.training else 0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=p, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            y = self.attn_dropout(F.softmax(att, dim=-1)) @ v
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))


class MLP(nn.Module):
    def __init__(self, n_embd, bias, dropout):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class NanoBlock(nn.Module):
    def __init__(self, n_embd, n_head, block_size, bias, dropout, flash):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias=bias)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, bias, dropout, flash)
        self.ln_2 = LayerNorm(n_embd, bias=bias)
        self.mlp = MLP(n_embd, bias, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, n_embd=32, n_head=2, n_layer=2, block_size=16, bias=False, dropout=0.1, flash=True):
        super().__init__()
        self.block_size = block_size
        self.model_args = dict(
            n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, bias=bias, vocab_size=vocab_size,
            dropout=dropout,
        )  # fmt: skip
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(vocab_size, n_embd),
                wpe=nn.Embedding(block_size, n_embd),
                drop=nn.Dropout(dropout),
                h=nn.ModuleList([NanoBlock(n_embd, n_head, block_size, bias, dropout, flash) for _ in range(n_layer)]),
                ln_f=LayerNorm(n_embd, bias=bias),
            )
        )
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx):
        t = idx.shape[1]
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(torch.arange(t)))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


# --- training a little, generating, saving ----------------------------------------------------------------------


def train_a_little(model: nn.Module, ids: torch.Tensor, steps: int = 6, seed: int = 0) -> nn.Module:
    """A few AdamW steps on batches of `ids` (every weight, LayerNorms' included, moves off its init); eval mode."""
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    T = model.block_size
    model.train()
    for _ in range(steps):
        ix = torch.randint(len(ids) - T - 1, (8,))
        x = torch.stack([ids[i : i + T] for i in ix])
        y = torch.stack([ids[i + 1 : i + T + 1] for i in ix])
        logits = model(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return model.eval()


@torch.no_grad()
def greedy(model: nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """The authors' `generate` with argmax instead of sampling: each token from the last `block_size` ids."""
    idx = torch.tensor([prompt])
    for _ in range(max_new_tokens):
        logits = model(idx[:, -model.block_size :])[:, -1, :]
        idx = torch.cat((idx, logits.argmax(-1, keepdim=True)), dim=1)
    return idx[0, len(prompt) :].tolist()


def save_lesson(model: GPTLanguageModel, path: Path) -> Path:
    torch.save(model.state_dict(), path)  # what a gpt.py user adds after training
    return path


def save_nanogpt(model: GPT, root: Path, chars: list[str], compiled: bool = True, dataset="shakespeare_char") -> Path:
    """nanoGPT's layout under `root`: `out-DATASET/ckpt.pt` as train.py writes it (from the torch.compile'd model,
    whose state_dict names start with `_orig_mod.`, when `compiled`) and `data/DATASET/meta.pkl` (with its
    `input.txt`) as prepare.py writes them. Returns the ckpt.pt path."""
    raw_model = torch.compile(model) if compiled else model  # compiling happens at the first call: none here
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = dict(out_dir=f"out-{dataset}", dataset=dataset, batch_size=8, learning_rate=1e-3, compile=compiled)
    checkpoint = {
        "model": raw_model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "model_args": model.model_args,
        "iter_num": 6,
        "best_val_loss": torch.tensor(4.1),
        "config": config,
    }
    out = root / f"out-{dataset}"
    out.mkdir(parents=True, exist_ok=True)
    torch.save(checkpoint, out / "ckpt.pt")
    write_meta(root / "data" / dataset / "meta.pkl", chars)
    return out / "ckpt.pt"


def write_meta(path: Path, chars: list[str]) -> Path:
    """nanoGPT's data/DATASET/meta.pkl, as its prepare.py pickles it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}
    with open(path, "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, f)
    return path
