"""The one way in: `load_backend(model, backend, threads)` turns a model name, folder or opened `ModelFolder` into a
ready backend. Every application loads models through it, so every backend gets the same checks: the folder's
(`gpt_serve.generation.model_folder`), then its own: torch, `model.safetensors` holds exactly the model's tensors, in
the right shapes, all finite; ONNX Runtime, the graph loads and was exported from this folder's vocabulary, config
and weights (`OnnxBackend`). torch is imported only for the `torch` backend.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from ...chargpt.vocab import CharVocab
from ...extras import MissingDependency, missing_extra
from ...files import check_regular
from ...models import WEIGHTS_FILE_NAME
from ..fields import BACKENDS
from ..model_folder import ModelFolder
from .interface import Backend
from .prompt_cache import DEFAULT_PROMPT_CACHE_BYTES, PromptCache, check_max_bytes
from .threads import check_threads


@dataclass(frozen=True)
class LoadedModel:
    """A backend ready for the engine (`stream_text(loaded.backend, loaded.vocab, ...)`), and the folder it came
    from."""

    folder: ModelFolder
    backend_key: str
    backend: Backend
    load_seconds: float

    @property
    def vocab(self) -> CharVocab:
        return self.folder.vocab

    @property
    def block_size(self) -> int:
        return int(self.backend.block_size)


def check_backend_key(key: object) -> str:
    """`key` if it names a backend (see `BACKENDS`); a ValueError listing them otherwise."""
    if not isinstance(key, str) or key not in BACKENDS:
        raise ValueError(f"unknown backend {key!r}; choose one of {list(BACKENDS)}")
    return key


def load_backend(
    model: str | os.PathLike | ModelFolder = "shakespeare",
    backend: str = "torch",
    threads: int | None = None,
    prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES,
) -> LoadedModel:
    """Loads a shipped model (by name), a model folder or an opened `ModelFolder` for `backend` (`"torch"`, `"onnx"`
    or `"onnx-int8"`).

    `threads`: intra-op threads per forward pass (None: the runtime's default). For PyTorch the count is
    process-wide (`torch.set_num_threads`); each ONNX Runtime session has its own.

    `prompt_cache_bytes`: what the backend may keep of the prompts it prefilled, so that a window prefilled before
    is copied in rather than computed again (`backend.prompt_cache`, a `PromptCache`; 0: none).

    Raises:
        ValueError: an unknown model or backend, a `prompt_cache_bytes` that is not an int >= 0, or a folder whose
            files are missing, corrupt or do not match each other (the message names the file and what is wrong).
        FileNotFoundError: a file the backend needs is missing (the message says how to make it).
        MissingDependency: the backend's runtime is not installed (a ModuleNotFoundError; the message says what
            to install).
    """
    start = time.perf_counter()
    key = check_backend_key(backend)
    threads = check_threads(threads)
    prompts = PromptCache(prompt_cache_bytes) if check_max_bytes(prompt_cache_bytes) else None
    folder = ModelFolder.open(model)
    if key == "torch":
        runner = _torch_backend(folder, threads)
    else:
        try:
            from .onnx_backend import OnnxBackend
        except ImportError as e:  # numpy and onnxruntime: the `onnx` extra
            raise missing_extra(f"the {key} backend", "onnx", e) from None
        runner = OnnxBackend(folder, quantized=key == "onnx-int8", threads=threads)
    runner.prompt_cache = prompts
    return LoadedModel(folder, key, runner, time.perf_counter() - start)


def _torch_backend(opened: ModelFolder, threads: int | None):
    try:
        import torch

        from ... import CharGPTConfig, CharGPTForCausalLM
        from .torch_backend import TorchBackend
    except ImportError as e:  # a torch-free install: numpy + onnxruntime and the package without dependencies
        raise MissingDependency(
            f"the torch backend needs PyTorch and transformers ({e}): pip install torch transformers, or use the "
            f"'onnx' or 'onnx-int8' backend",
            name=e.name,
        ) from None

    folder = opened.path
    weights = check_regular(folder / WEIGHTS_FILE_NAME)
    if not weights.is_file():
        found = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".safetensors"))
        raise FileNotFoundError(
            f"{folder} has no {WEIGHTS_FILE_NAME} (found: {found or 'no weights'}); save the model with "
            f"save_pretrained, which writes it. Pickled weights (pytorch_model.bin) are not loaded: they can run code. "
            f"To convert a file you trust: CharGPTForCausalLM.from_pretrained(folder, use_safetensors=False)"
            f".save_pretrained(folder)"
        )
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        config = CharGPTConfig.from_dict(dict(opened.config))  # the config read and checked, not read again
        model, info = CharGPTForCausalLM.from_pretrained(
            folder, config=config, use_safetensors=True, output_loading_info=True
        )
    except (OSError, RuntimeError, ValueError) as e:  # SafetensorError is an Exception: caught below
        raise ValueError(f"cannot load the weights in {weights}: {type(e).__name__}: {str(e)[:300]}") from None
    except Exception as e:
        if type(e).__name__ != "SafetensorError":
            raise
        raise ValueError(f"{weights} is truncated or corrupt ({e}); save the model again") from None
    problems = {k: info.get(k) for k in ("missing_keys", "unexpected_keys", "mismatched_keys") if info.get(k)}
    if problems:
        shown = "; ".join(f"{k.replace('_', ' ')}: {sorted(map(str, v))[:5]}" for k, v in problems.items())
        raise ValueError(f"{weights} does not hold this model's weights ({shown})")
    check_finite_weights(model, weights)
    return TorchBackend(model)


def check_finite_weights(model, weights: Path) -> None:
    """A ValueError naming the first tensors that hold NaN or infinite values (`weights`: the file they came from).
    One pass over the parameters and buffers: milliseconds (docs/benchmarks.md, `benchmarks/finite_weights.py`)."""
    import torch

    def finite(t) -> bool:  # NaN propagates through min and max: two reductions, no tensor of flags
        return not t.is_floating_point() or not t.numel() or bool(torch.isfinite(torch.stack(torch.aminmax(t))).all())

    with torch.no_grad():
        bad = [name for name, t in (*model.named_parameters(), *model.named_buffers()) if not finite(t)]
    if bad:
        raise ValueError(
            f"{weights} holds NaN or infinite values in {len(bad)} tensor{'s' if len(bad) > 1 else ''} "
            f"({', '.join(bad[:5])}{', ...' if len(bad) > 5 else ''}): the model would compute NaN; train or save it "
            f"again"
        )
