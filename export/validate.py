"""The export's self-checks: the ONNX checker, ONNX Runtime against PyTorch, and int8 against fp32 on real text.

`compare_with_torch` runs the Hugging Face layout graph through a plain `InferenceSession` (not `OnnxBackend`), so
it checks the file itself: output names, shapes and values on a left-padded batch, for a prefill from an empty past
and several decode steps that feed each side's own cache back in. `compare_inplace_with_torch` does the same for
the in-place graph, bound as the backend binds it (`onnx_session.run_inplace`), on rows prefilled alone and then
decoded together; `compare_inplace_with_main` checks an in-place graph against its Hugging Face layout twin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
from transformers.cache_utils import DynamicCache

from gpt_serve.chargpt.modeling_chargpt import CharGPTForCausalLM
from gpt_serve.generation.backends.onnx_session import run_inplace
from gpt_serve.generation.inline import left_pad
from gpt_serve.onnx_contract import INPUT_NAMES, LOGITS_NAME, PRESENT_NAME, past_names, present_names

FP32_LOGITS_ATOL = 1e-4
# int8 quantization may raise the validation loss by at most this much (nats per character). It is the
# lesson's seed-to-seed spread (~±0.015, FIELD-NOTES) rounded up: int8 must not cost more than retraining noise.
INT8_MAX_VAL_LOSS_INCREASE = 0.02


@dataclass
class ParityResult:
    """ONNX Runtime vs PyTorch on one batch (left-padded, or for the in-place graph rows prefilled alone): a prefill
    then `decode_steps` cached steps."""

    batch_lengths: list[int]
    decode_steps: int
    names_ok: bool
    shape_errors: list[str] = field(default_factory=list)
    max_abs_logits_prefill: float = 0.0
    max_abs_logits_decode: float = 0.0
    max_abs_cache: float = 0.0

    @property
    def max_abs_logits(self) -> float:
        return max(self.max_abs_logits_prefill, self.max_abs_logits_decode)


def check_graph(path: Path) -> None:
    """`onnx.checker` with full shape inference; raises `onnx.checker.ValidationError` on failure."""
    onnx.checker.check_model(str(path), full_check=True)


def parity_batch(block_size: int, decode_steps: int) -> list[int]:
    """Prompt lengths of the parity batch: three rows, two of them left-padded, that leave room for the decode steps
    inside the window."""
    longest = max(1, min(12, block_size - decode_steps))
    return [longest, max(1, longest // 2), 1]


def compare_with_torch(
    model: CharGPTForCausalLM, session: ort.InferenceSession, decode_steps: int = 4, seed: int = 0
) -> ParityResult:
    """Max |ONNX Runtime - PyTorch| over logits and cache on real (unpadded) positions, names and shapes checked.

    Each decode step feeds both sides the token PyTorch ranks first, and each side its own cache.
    """
    config = model.config
    n_layer = config.n_layer
    lengths = parity_batch(config.block_size, decode_steps)
    rng = np.random.default_rng(seed)
    ids, mask = left_pad([rng.integers(0, config.vocab_size, n).tolist() for n in lengths])
    B = len(lengths)
    expected_outputs = [LOGITS_NAME, *present_names(n_layer)]
    result = ParityResult(lengths, decode_steps, names_ok=[o.name for o in session.get_outputs()] == expected_outputs)
    if not result.names_ok:
        return result

    empty = np.zeros((B, config.n_head, 0, config.head_size), dtype=np.float32)
    ort_past = [empty] * (2 * n_layer)
    torch_cache = DynamicCache(config=config)
    new_ids = ids
    for step in range(decode_steps + 1):
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)[:, -new_ids.shape[1] :]
        feeds = dict(zip(INPUT_NAMES, (new_ids, mask, positions), strict=True))
        feeds.update(zip(past_names(n_layer), ort_past, strict=True))
        ort_out = dict(zip(expected_outputs, session.run(expected_outputs, feeds), strict=True))
        with torch.inference_mode():
            out = model(
                input_ids=torch.from_numpy(new_ids),
                attention_mask=torch.from_numpy(mask),
                position_ids=torch.from_numpy(positions),
                cache=torch_cache,
                use_cache=True,
            )
        torch_out = {LOGITS_NAME: out.logits.float().numpy()}
        for i, layer in enumerate(out.cache.layers[:n_layer]):
            for kind, value in (("key", layer.keys), ("value", layer.values)):
                torch_out[PRESENT_NAME.format(layer=i, kind=kind)] = value.numpy()

        result.shape_errors += _shape_errors(step, expected_outputs, ort_out, torch_out)
        if result.shape_errors:
            return result
        real_new = mask[:, -new_ids.shape[1] :].astype(bool)  # (B, T): logits of padding positions are meaningless
        logits_diff = float(np.abs(ort_out[LOGITS_NAME] - torch_out[LOGITS_NAME])[real_new].max())
        if step == 0:
            result.max_abs_logits_prefill = logits_diff
        else:
            result.max_abs_logits_decode = max(result.max_abs_logits_decode, logits_diff)
        real_all = mask.astype(bool)  # (B, P + T)
        for name in present_names(n_layer):
            diff = np.abs(ort_out[name] - torch_out[name]).transpose(0, 2, 1, 3)[real_all]  # (real, H, hs)
            result.max_abs_cache = max(result.max_abs_cache, float(diff.max()))

        next_token = torch_out[LOGITS_NAME][:, -1].argmax(-1)[:, None].astype(np.int64)  # (B, 1)
        ort_past = [ort_out[name] for name in present_names(n_layer)]
        new_ids = next_token
        mask = np.concatenate([mask, np.ones((B, 1), dtype=np.int64)], axis=1)
    return result


def _shape_errors(step: int, names: list[str], ort_out: dict, torch_out: dict) -> list[str]:
    return [
        f"step {step} {name}: ORT {ort_out[name].shape}, torch {torch_out[name].shape}"
        for name in names
        if ort_out[name].shape != torch_out[name].shape
    ]


class _InPlaceParity:
    """One run of `compare_inplace_with_torch`: the graph's cache buffers (random numbers past each row's tokens),
    PyTorch's cache per row, the tokens both sides are fed next, and the `result` the checks fill in."""

    def __init__(self, model: CharGPTForCausalLM, session: ort.InferenceSession, result: ParityResult, seed: int):
        config = self.config = model.config
        self.model, self.session, self.result = model, session, result
        self.names = present_names(config.n_layer)
        self.rng = np.random.default_rng(seed)
        B, C = len(result.batch_lengths), config.block_size
        shape = (B, config.n_head, C, config.head_size)
        self.cache = [self.rng.standard_normal(shape).astype(np.float32) for _ in range(2 * config.n_layer)]
        self.torch_caches: list = []
        self.tokens = np.zeros(B, dtype=np.int64)

    def run(self, ids, filled, past) -> dict[str, np.ndarray]:
        """The graph as `OnnxInPlaceBatch` runs it (`run_inplace`: each `present.*` bound to its `cache.*` input's
        memory), on a copy of `past`, which stays as it was for the checks."""
        buffers = [np.array(p, copy=True) for p in past]
        logits = run_inplace(self.session, ids, filled, buffers)
        return {LOGITS_NAME: logits, **dict(zip(self.names, buffers, strict=True))}

    def compare(self, step: int, ort_out, torch_logits, torch_new, columns, past) -> float:
        """max |Δlogits|; checks the written columns against PyTorch's new keys and that no other one changed."""
        result = self.result
        shapes = {LOGITS_NAME: torch_logits.shape, **{name: past[0].shape for name in self.names}}
        result.shape_errors += [
            f"step {step} {name}: ORT {ort_out[name].shape}, expected {shape}"
            for name, shape in shapes.items()
            if ort_out[name].shape != shape
        ]
        if result.shape_errors:
            return 0.0
        for name, before, new in zip(self.names, past, torch_new, strict=True):
            written = np.zeros(before.shape[::2], dtype=bool)  # (rows, columns)
            for b, cols in enumerate(columns):
                written[b, cols] = True
                got = ort_out[name][b][:, cols]
                result.max_abs_cache = max(result.max_abs_cache, float(np.abs(got - new[b]).max()))
            untouched = ort_out[name].transpose(0, 2, 1, 3)[~written] == before.transpose(0, 2, 1, 3)[~written]
            if not untouched.all():
                result.shape_errors.append(f"step {step} {name}: columns other than the new tokens' changed")
        return float(np.abs(ort_out[LOGITS_NAME] - torch_logits).max())

    def layer_tensors(self, cache) -> list[torch.Tensor]:
        return [t for layer in cache.layers[: self.config.n_layer] for t in (layer.keys, layer.values)]

    def prefill(self) -> None:
        """Each row alone into its empty buffer."""
        for b, length in enumerate(self.result.batch_lengths):
            prompt = self.rng.integers(0, self.config.vocab_size, (1, length))
            past = [c[b : b + 1] for c in self.cache]
            ort_out = self.run(prompt, np.zeros(1, dtype=np.int64), past)
            with torch.inference_mode():
                ids, cache = torch.from_numpy(prompt), DynamicCache(config=self.config)
                out = self.model(input_ids=ids, cache=cache, use_cache=True)
            new = [t.numpy() for t in self.layer_tensors(out.cache)]
            logits = out.logits[:, -1].float().numpy()
            diff = self.compare(0, ort_out, logits, new, [np.arange(length)], past)
            if self.result.shape_errors:
                return
            self.result.max_abs_logits_prefill = max(self.result.max_abs_logits_prefill, diff)
            for c, name in zip(self.cache, self.names, strict=True):
                c[b] = ort_out[name][0]
            self.torch_caches.append(out.cache)
            self.tokens[b] = int(out.logits[0, -1].argmax())

    def torch_step(self, filled) -> tuple[np.ndarray, list[np.ndarray]]:
        """PyTorch's decode step, each row alone with its own cache: the logits (B, V) and the new keys/values."""
        config, B = self.config, len(self.tokens)
        logits = np.zeros((B, config.vocab_size), dtype=np.float32)
        new = [np.zeros((B, config.n_head, 1, config.head_size), dtype=np.float32) for _ in range(2 * config.n_layer)]
        with torch.inference_mode():
            for b in range(B):
                ids, positions = torch.tensor([[self.tokens[b]]]), torch.tensor([[filled[b]]])
                out = self.model(input_ids=ids, position_ids=positions, cache=self.torch_caches[b], use_cache=True)
                logits[b] = out.logits[0, -1].float().numpy()
                for j, t in enumerate(self.layer_tensors(out.cache)):
                    new[j][b] = t[0, :, -1:].numpy()
        return logits, new

    def decode(self, decode_steps: int) -> None:
        """The rows together, each step on the graph's own cache."""
        filled = np.array(self.result.batch_lengths, dtype=np.int64)
        for step in range(1, decode_steps + 1):
            ort_out = self.run(self.tokens[:, None], filled.copy(), self.cache)
            logits, new = self.torch_step(filled)
            diff = self.compare(step, ort_out, logits, new, [np.array([f]) for f in filled], self.cache)
            if self.result.shape_errors:
                return
            self.result.max_abs_logits_decode = max(self.result.max_abs_logits_decode, diff)
            self.cache = [ort_out[name] for name in self.names]
            self.tokens = logits.argmax(-1).astype(np.int64)
            filled += 1


def compare_inplace_with_torch(
    model: CharGPTForCausalLM, session: ort.InferenceSession, decode_steps: int = 4, seed: int = 0
) -> ParityResult:
    """Max |ONNX Runtime - PyTorch| of the in-place graph (`export.decoders.DecoderInPlace`) over logits and the
    new keys/values it writes, names and shapes checked: each row of different lengths prefilled alone into an
    empty `block_size`-column buffer, then the rows decoding together for `decode_steps` steps, the outputs bound
    to the inputs' memory as `OnnxInPlaceBatch` binds them (so each step's cache is the graph's own). Columns past
    each row's tokens hold random numbers, which the graph must neither read nor change. PyTorch runs each row
    alone with its own cache, and both sides are fed the token PyTorch ranks first."""
    lengths = parity_batch(model.config.block_size, decode_steps)
    expected_outputs = [LOGITS_NAME, *present_names(model.config.n_layer)]
    result = ParityResult(lengths, decode_steps, names_ok=[o.name for o in session.get_outputs()] == expected_outputs)
    if not result.names_ok:
        return result
    parity = _InPlaceParity(model, session, result, seed)
    parity.prefill()
    if not result.shape_errors:
        parity.decode(decode_steps)
    return result


def compare_inplace_with_main(
    config, main: ort.InferenceSession, inplace: ort.InferenceSession, lengths=(12, 6, 1), seed: int = 0
) -> float:
    """Max |Δ last-token logits| between a Hugging Face layout graph and an in-place graph on prompts prefilled alone
    (the first from an empty past, the second into an empty `block_size`-column buffer)."""
    rng = np.random.default_rng(seed)
    n_layer, H, hs = config.n_layer, config.n_head, config.head_size
    worst = 0.0
    for length in (min(n, config.block_size) for n in lengths):
        prompt = rng.integers(0, config.vocab_size, (1, length))
        feeds = dict(zip(INPUT_NAMES, (prompt, np.ones_like(prompt), np.arange(length)[None]), strict=True))
        feeds.update({name: np.zeros((1, H, 0, hs), np.float32) for name in past_names(n_layer)})
        (expected,) = main.run([LOGITS_NAME], feeds)
        buffers = [np.zeros((1, H, config.block_size, hs), np.float32) for _ in range(2 * n_layer)]
        got = run_inplace(inplace, prompt, np.zeros(1, dtype=np.int64), buffers)
        worst = max(worst, float(np.abs(got - expected[:, -1]).max()))
    return worst


def eval_windows(val_ids: np.ndarray, block_size: int, max_tokens: int) -> np.ndarray:
    """Windows (N, block_size + 1) of the validation ids, evenly spread over the split, about `max_tokens` targets.

    Deterministic, so fp32 and int8 (and two runs) see the same text.
    """
    n_possible = len(val_ids) - block_size
    if n_possible < 1:
        raise ValueError(f"the validation text has {len(val_ids)} tokens, fewer than block_size + 1 = {block_size + 1}")
    n = max(1, min(n_possible, max_tokens // block_size))
    starts = np.linspace(0, n_possible - 1, n).astype(np.int64)
    return np.stack([val_ids[s : s + block_size + 1] for s in starts]).astype(np.int64)


def onnx_val_loss(
    session: ort.InferenceSession, windows: np.ndarray, n_layer: int, n_head: int, head_size: int, batch_size: int = 16
) -> float:
    """Mean next-character cross-entropy of the ONNX graph over `windows` (N, T + 1): prefill from an empty past."""
    total, count = 0.0, 0
    for lo in range(0, len(windows), batch_size):
        chunk = windows[lo : lo + batch_size]
        x, y = chunk[:, :-1], chunk[:, 1:]
        B, T = x.shape
        empty = np.zeros((B, n_head, 0, head_size), dtype=np.float32)
        positions = np.broadcast_to(np.arange(T, dtype=np.int64), (B, T)).copy()
        feeds = dict(zip(INPUT_NAMES, (x, np.ones((B, T), dtype=np.int64), positions), strict=True))
        feeds.update({name: empty for name in past_names(n_layer)})
        (logits,) = session.run([LOGITS_NAME], feeds)  # (B, T, V)
        z = logits.astype(np.float64)
        z -= z.max(axis=-1, keepdims=True)
        log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        total -= float(np.take_along_axis(log_probs, y[..., None], axis=-1).sum())
        count += y.size
    return total / count
