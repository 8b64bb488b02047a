"""Generation: load a model for a backend, then one token loop drives it (numpy; torch only in its backend).

    >>> from gpt_serve.generation import SamplingParams, load_backend, stream_text
    >>> loaded = load_backend("shakespeare", "onnx-int8")          # or "torch", "onnx"; or a model folder
    >>> for piece in stream_text(loaded.backend, loaded.vocab, "ROMEO:", 200, SamplingParams(temperature=0.8), seed=0):
    ...     print(piece, end="")

- `spec`: the request specification, every field's type, range, default and aliases in one table
  (`parse_request` -> `GenerationRequest`, `RequestError`);
- `backends.loading`: `load_backend`, the table of backend keys (`BACKENDS`) and their aliases, the checks every
  backend needs;
- `backends.interface`: the `Backend` protocol (and its `DecodeBatch`) that `backends.torch_backend` (`TorchBackend`,
  its fast decode path in `backends.torch_decode`) and `backends.onnx_backend` (`OnnxBackend`) implement;
- `scheduler`: the one token loop, continuous batching (`Scheduler`), which decides who runs; below it `batch` (the
  running batch and the exact-mode rows: the forward passes), `waiting` (the queue), `rows` (a row's state and the
  output side of a step), `logprobs` (a prompt's own logprobs, in chunks) and `runner` (the threads that run loops,
  or `InlineRunner`, none); `requests`: its `Request` and `Stream`;
- `text`: the one text stream (`TextStream`: encode, submit, decode with stop strings, cancel);
- `inline`: the same for a script (`generate_tokens`, `stream_text`, `generate_text`), stepped on its thread;
- `sampling`: `SamplingParams` and the sampler, pure functions with an explicit RNG;
- the ONNX side: graph loading and checks in `backends.onnx_session`, caches and decode batches in
  `backends.onnx_batches`, the graph contract the export writes in `gpt_serve.onnx_contract`.
A server's models by name are `gpt_serve.serving.registry`'s (`ModelRegistry`).
The window rule past `block_size` is `gpt_serve.chargpt.window`, shared with the transformers model.

Importing this package imports neither torch nor onnxruntime; each backend module imports its own runtime.
"""

from ..chargpt.window import DEFAULT_WINDOW_MODE, WINDOW_MODES, window_keep
from .backends.interface import Backend
from .backends.loading import LoadedModel, load_backend
from .fields import BACKENDS, RequestError
from .inline import generate_text, generate_tokens, stream_text
from .requests import EngineError
from .sampling import SamplingParams
from .spec import GenerationRequest, parse_request

__all__ = [
    "BACKENDS",
    "DEFAULT_WINDOW_MODE",
    "WINDOW_MODES",
    "Backend",
    "EngineError",
    "GenerationRequest",
    "LoadedModel",
    "RequestError",
    "SamplingParams",
    "generate_text",
    "generate_tokens",
    "load_backend",
    "parse_request",
    "stream_text",
    "window_keep",
]
