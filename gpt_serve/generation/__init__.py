"""Generation: a checked request, one token loop over a backend, and text on top. docs/architecture.md draws a
request's journey through these modules.

    >>> from gpt_serve.generation import SamplingParams, load_backend, stream_text
    >>> loaded = load_backend("shakespeare", "onnx-int8")          # or "torch", "onnx"; or a model folder
    >>> for piece in stream_text(loaded.backend, loaded.vocab, "ROMEO:", 200, SamplingParams(temperature=0.8), seed=0):
    ...     print(piece, end="")

- the request: `fields` (the table, `BACKENDS`), `structured` (its structured-output fields), `spec`
  (`GenerationRequest`, `parse_request`), `sampling` (`SamplingParams` and the sampler);
- the text: `text` (`TextStream`, every surface's), `inline` (`stream_text` for a script), `constraints` (a
  structured output compiled for a vocabulary);
- the loop: `scheduler` (`Scheduler`) with `requests` (its `Request`, `Stream`), `waiting`, `batch`, `rows` (a row's
  state, penalties and draw), `logprobs`, `runner`;
- a model: `model_folder` (`ModelFolder`: a folder read and checked once); `backends`: `interface` (`Backend`),
  `loading` (`load_backend`), the PyTorch and ONNX Runtime backends.

Importing this package imports neither torch nor onnxruntime; each backend module imports its own runtime.
"""

from ..chargpt.window import DEFAULT_WINDOW_MODE, WINDOW_MODES, window_keep
from .backends.interface import Backend
from .backends.loading import LoadedModel, load_backend
from .fields import BACKENDS, RequestError
from .inline import generate_text, generate_tokens, stream_text
from .model_folder import ModelFolder
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
    "ModelFolder",
    "RequestError",
    "SamplingParams",
    "generate_text",
    "generate_tokens",
    "load_backend",
    "parse_request",
    "stream_text",
    "window_keep",
]
