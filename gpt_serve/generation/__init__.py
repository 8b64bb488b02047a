"""Generation: load a model for a backend, then one token loop drives it (numpy; torch only in its backend).

    >>> from gpt_serve.generation import SamplingParams, load_backend, stream_text
    >>> loaded = load_backend("shakespeare", "onnx-int8")          # or "torch", "onnx"; or a model folder
    >>> for piece in stream_text(loaded.backend, loaded.vocab, "ROMEO:", 200, SamplingParams(temperature=0.8), seed=0):
    ...     print(piece, end="")

- `loading`: `load_backend`, the table of backend keys (`BACKENDS`), the checks every backend needs;
- `engine`: the token loop (`generate_tokens`), text on top (`stream_text`, `generate_text`), window modes;
- `sampling`: `SamplingParams` and the sampler, a pure function with an explicit RNG;
- `torch_backend` (`TorchBackend`) and `onnx_backend` (`OnnxBackend`): what computes the logits; the ONNX side's
  graph loading and checks are `onnx_session`'s, its caches and decode batches `onnx_batches`';
- `scheduler`: continuous batching, one decode loop for every request of a backend (`Scheduler`);
- `registry`: a server's models by name, each (model, backend) loaded once with its scheduler (`ModelRegistry`).

Importing this package imports neither torch nor onnxruntime; each backend module imports its own runtime.
"""

from .engine import WINDOW_MODES, Backend, generate_text, generate_tokens, stream_text, window_keep
from .loading import BACKENDS, LoadedModel, load_backend
from .sampling import SamplingParams

__all__ = [
    "BACKENDS",
    "WINDOW_MODES",
    "Backend",
    "LoadedModel",
    "SamplingParams",
    "generate_text",
    "generate_tokens",
    "load_backend",
    "stream_text",
    "window_keep",
]
