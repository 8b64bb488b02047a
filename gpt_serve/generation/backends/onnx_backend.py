"""The ONNX Runtime backend of the generation engine: torch-free inference from a model folder's ONNX export.

This module imports only numpy, onnxruntime, the standard library and the torch-free parts of gpt_serve (vocab,
engine, sampling, models), so numpy and onnxruntime are enough to generate text, and torch is never imported
even where it is installed (an import-linter contract and a test check both):

    >>> from gpt_serve.generation import SamplingParams, stream_text
    >>> from gpt_serve.generation.backends.onnx_backend import OnnxBackend
    >>> backend = OnnxBackend("shakespeare", quantized=True, threads=2)
    >>> for piece in stream_text(backend, backend.vocab, "ROMEO:", 200, SamplingParams(0.8), seed=0):
    ...     print(piece, end="")

`gpt_serve.generation.load_backend("shakespeare", "onnx-int8")` is the usual way in.

This module owns `OnnxBackend`: what computes the logits, and the checks of each call's inputs. The export's
layout (file names, graph inputs/outputs, metadata keys) is named in `gpt_serve.onnx_contract`; loading a graph
and checking it against the folder is `onnx_session`'s; the caches between runs (`OnnxCache` and the decode
batches) are `onnx_batches`'; each name is imported from the module that defines it. One graph (the Hugging Face layout,
`onnx/model*.onnx`) serves prefill (an empty past) and decode; where the folder has the in-place decode graph
(`onnx/decoder_inplace*.onnx`: `run_inplace`, `OnnxInPlaceBatch`), this backend prefills and decodes with it.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import onnxruntime as ort

from ...onnx_contract import (
    ATTENTION_MASK_NAME,
    BLOCK_SIZE_KEY,
    HEAD_SIZE_KEY,
    INPUT_IDS_NAME,
    INPUT_NAMES,
    LOGITS_NAME,
    N_HEAD_KEY,
    N_LAYER_KEY,
    ONNX_FORMAT,
    POSITION_IDS_NAME,
    VOCAB_SIZE_KEY,
    onnx_path,
    past_names,
    present_names,
)
from ..model_folder import ModelFolder
from .interface import check_token_ids
from .onnx_batches import OnnxCache, OnnxDecodeBatch, OnnxInPlaceBatch
from .onnx_session import (
    UnsupportedGraph,
    check_folder,
    check_inplace_graph,
    check_io,
    check_metadata,
    load_session,
    run_inplace,
)
from .prompt_cache import PromptCache

logger = logging.getLogger(__name__)


class OnnxBackend:
    """Runs a model folder's ONNX export for the generation engine (`gpt_serve.generation.inline`), without torch.

    Args:
        model_dir: a model folder (holding `config.json`, `vocab.json` and `onnx/`), the name of a shipped model
            (see `gpt_serve.models.list_models`), or a `ModelFolder` already opened (not read again).
        quantized: load `onnx/model_quantized.onnx` (int8 weights) instead of `onnx/model.onnx` (fp32).
        int8_compute: for the int8 file, ONNX Runtime's int8 kernel (the weights stay int8 in memory: faster where
            they do not fit in the CPU's cache); False dequantizes them once at load and computes in fp32, as the
            in-browser page does (the same greedy tokens). See `onnx_session.session_options`.
        threads: intra-op threads (None: ONNX Runtime's default, one per physical core).
        providers: ONNX Runtime execution providers (default `["CPUExecutionProvider"]`). With the CUDA provider
            first, the KV cache stays on the GPU between steps.
        inplace: decode with the folder's in-place decode graph where it has one (`onnx/decoder_inplace*.onnx`,
            written by `python -m export` since it exists; see `OnnxInPlaceBatch`); False, or a folder without it:
            every step runs the Hugging Face layout graph.

    Raises:
        FileNotFoundError: the ONNX file (or `vocab.json`) is missing.
        ValueError: the folder fails `ModelFolder.open`'s checks, or the ONNX file (or the in-place graph beside
            it) is truncated or corrupt, was not written by `python -m export`, or does not match the folder's
            vocabulary, config or main graph.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike | ModelFolder,
        quantized: bool = False,
        threads: int | None = None,
        providers=None,
        int8_compute: bool = True,
        inplace: bool = True,
    ):
        self.folder = ModelFolder.open(model_dir)
        self.model_dir, self.vocab = self.folder.path, self.folder.vocab
        self.quantized = bool(quantized)
        self.path = onnx_path(self.model_dir, self.quantized)
        self.description = f"the {'onnx-int8' if quantized else 'onnx'} backend (ONNX Runtime) of {self.path}"
        self.session = load_session(self.path, threads, providers, int8_compute)
        self.metadata = dict(self.session.get_modelmeta().custom_metadata_map)
        check_metadata(self.path, self.metadata, ONNX_FORMAT)
        self.block_size = int(self.metadata[BLOCK_SIZE_KEY])
        self.vocab_size = int(self.metadata[VOCAB_SIZE_KEY])
        self.n_layer = int(self.metadata[N_LAYER_KEY])
        self.n_head = int(self.metadata[N_HEAD_KEY])
        self.head_size = int(self.metadata[HEAD_SIZE_KEY])
        check_folder(self.path, self.metadata, self.folder)
        check_io(self.session, self.path, [*INPUT_NAMES, *past_names(self.n_layer)], INPUT_NAMES)
        self._past_names = past_names(self.n_layer)
        self._present_names = present_names(self.n_layer)
        first = self.session.get_providers()[0]
        self._cache_device = "cuda" if first == "CUDAExecutionProvider" else "cpu"
        self.prompt_cache: PromptCache | None = None  # prefilled windows kept across batches (`load_backend` sets one)
        self._empty_past: dict[int, Any] = {}  # batch size -> an empty (B, H, 0, head_size) past, made once
        self.inplace_path = onnx_path(self.model_dir, self.quantized, inplace=True)
        self.inplace_session = None
        if inplace and self._cache_device == "cpu" and self.inplace_path.is_file():
            try:
                self.inplace_session = load_session(self.inplace_path, threads, providers, int8_compute)
            except UnsupportedGraph as e:  # an ONNX Runtime without the graph's GroupQueryAttention kernel
                logger.warning("%s; decoding with the Hugging Face layout graph meanwhile", e)
        if self.inplace_session is not None:
            check_inplace_graph(self.inplace_session, self.inplace_path, self.path, self.metadata)
        elif inplace and self._cache_device == "cpu":
            logger.info(
                "%s has no %s: decoding with the Hugging Face layout graph", self.model_dir, self.inplace_path.name
            )

    def __repr__(self) -> str:
        kind = "int8" if self.quantized else "fp32"
        return f"OnnxBackend({str(self.model_dir)!r}, {kind}, block_size={self.block_size}, providers={self.providers})"

    @property
    def providers(self) -> list[str]:
        return self.session.get_providers()

    def new_batch(self, max_rows: int) -> OnnxInPlaceBatch | OnnxDecodeBatch:
        """An empty batch of at most `max_rows` rows for the scheduler (`gpt_serve.generation.scheduler`): on the
        in-place graph where the folder has one, else on the Hugging Face layout graph."""
        if self.inplace_session is not None:
            return OnnxInPlaceBatch(self, max_rows)
        return OnnxDecodeBatch(self, max_rows)

    def run_inplace(self, input_ids: np.ndarray, lengths: np.ndarray, cache: list[np.ndarray]) -> np.ndarray:
        """`run_inplace` on this backend's in-place graph, with the ids checked (a sampled or prompt id outside the
        vocabulary would otherwise be embedded as some other row of the table)."""
        check_token_ids(input_ids, self.vocab_size)
        return run_inplace(self.inplace_session, input_ids, lengths, cache)

    def window_logits(self, input_ids: np.ndarray) -> np.ndarray:
        """Logits (B, V) of the last token of B windows of ids (B, T) at positions 0..T-1, without a cache: the
        full-window forward that exact mode runs for every token past `block_size`. On the in-place graph where the
        folder has one (so that a scheduler runs one ONNX Runtime session: two would each keep their threads
        spinning after their runs, against each other on a small machine), else on the other."""
        input_ids = _as_int64("input_ids", input_ids)
        ones, positions = np.ones_like(input_ids), np.broadcast_to(np.arange(input_ids.shape[1]), input_ids.shape)
        if self.inplace_session is None:
            return self.forward(input_ids, ones, positions, None)[0]
        self._check_inputs(input_ids, ones, positions, 0)  # the vocabulary's check among them
        B, T = input_ids.shape
        scratch = [np.zeros((B, self.n_head, T, self.head_size), dtype=np.float32) for _ in range(2 * self.n_layer)]
        logits = run_inplace(self.inplace_session, input_ids, np.zeros(B, dtype=np.int64), scratch)
        return np.ascontiguousarray(logits)

    def sequence_logits(self, ids: np.ndarray) -> np.ndarray:
        """float32 logits (T, V) of every position of one window of ids (T,) at positions 0..T-1, no cache (on the
        Hugging Face layout graph, whose logits cover every position)."""
        input_ids = _as_int64("input_ids", np.asarray(ids)[None])
        ones, positions = np.ones_like(input_ids), np.arange(input_ids.shape[1])[None]
        self._check_inputs(input_ids, ones, positions, 0)
        feeds = {INPUT_IDS_NAME: input_ids, ATTENTION_MASK_NAME: ones, POSITION_IDS_NAME: positions}
        empty = np.zeros((1, self.n_head, 0, self.head_size), dtype=np.float32)
        feeds.update((name, empty) for name in self._past_names)
        logits = self.session.run([LOGITS_NAME], feeds)[0]
        return np.ascontiguousarray(logits[0], dtype=np.float32)

    def forward(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, position_ids: np.ndarray, cache: OnnxCache | None
    ) -> tuple[np.ndarray, OnnxCache]:
        """Logits (B, vocab) of the last position, and the cache extended by the T new tokens.

        Args:
            input_ids: int64 (B, T) ids; positions where `attention_mask` is 0 may hold any id (they are embedded as
                id 0 and masked out, as in the PyTorch model).
            attention_mask: int64 (B, past + T), 1 for real tokens, 0 for (left) padding, over cached and new columns.
            position_ids: int64 (B, T), in `[0, block_size)`.
            cache: None (empty) or the cache this backend returned for the same batch.
        """
        input_ids = _as_int64("input_ids", input_ids)
        attention_mask = _as_int64("attention_mask", attention_mask)
        position_ids = _as_int64("position_ids", position_ids)
        B, T = input_ids.shape
        past = self._check_cache(cache, B)
        self._check_inputs(input_ids, attention_mask, position_ids, past)

        # A binding per call (cheap) keeps `forward` safe to call from several threads, as `session.run` is.
        binding = self.session.io_binding()
        binding.bind_cpu_input(INPUT_IDS_NAME, input_ids)
        binding.bind_cpu_input(ATTENTION_MASK_NAME, attention_mask)
        binding.bind_cpu_input(POSITION_IDS_NAME, position_ids)
        past_values = cache.values if cache is not None else self._empty(B)
        for name, value in zip(self._past_names, past_values, strict=True):
            binding.bind_ortvalue_input(name, value)
        binding.bind_output(LOGITS_NAME, "cpu")
        for name in self._present_names:
            binding.bind_output(name, self._cache_device)  # ORT allocates; the values become the next past
        self.session.run_with_iobinding(binding)
        outputs = binding.get_outputs()
        logits = outputs[0].numpy()[:, -1]  # (B, vocab)
        new_cache = OnnxCache(list(outputs[1:]), past + T, B, self)
        return np.ascontiguousarray(logits, dtype=np.float32), new_cache

    def _empty(self, batch_size: int) -> list:
        if batch_size not in self._empty_past:
            empty = np.zeros((batch_size, self.n_head, 0, self.head_size), dtype=np.float32)
            value = ort.OrtValue.ortvalue_from_numpy(empty, self._cache_device, 0)
            self._empty_past[batch_size] = [value] * len(self._past_names)
        return self._empty_past[batch_size]

    def _check_cache(self, cache: Any, batch_size: int) -> int:
        if cache is None:
            return 0
        if not isinstance(cache, OnnxCache) or cache.owner is not self:
            raise TypeError(
                f"cache must be None or the OnnxCache this backend returned, got {type(cache).__name__}"
                + (" from another backend" if isinstance(cache, OnnxCache) else "")
            )
        if cache.batch_size != batch_size:
            raise ValueError(f"the cache holds a batch of {cache.batch_size} rows but input_ids has {batch_size}")
        return cache.length

    def _check_inputs(self, input_ids, attention_mask, position_ids, past: int) -> None:
        B, T = input_ids.shape
        if T == 0 or B == 0:
            raise ValueError(f"input_ids must hold at least one token per row, got shape {input_ids.shape}")
        if position_ids.shape != (B, T):
            raise ValueError(f"position_ids must have the shape of input_ids {(B, T)}, got {position_ids.shape}")
        if attention_mask.shape != (B, past + T):
            raise ValueError(
                f"attention_mask must have shape (batch, past + sequence) = ({B}, {past + T}) with {past} cached "
                f"tokens, got {attention_mask.shape}"
            )
        check_token_ids(input_ids[attention_mask[:, -T:] != 0], self.vocab_size)  # padding positions may hold any id
        if position_ids.min() < 0 or position_ids.max() >= self.block_size:
            raise ValueError(
                f"position_ids must lie in [0, block_size) = [0, {self.block_size}), got "
                f"[{position_ids.min()}, {position_ids.max()}]; the engine slides the window past block_size"
            )


def _as_int64(name: str, array: Any) -> np.ndarray:
    """`array` as a contiguous 2-D int64 array; any integer dtype is accepted, anything else is a TypeError."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy array of int64, got {type(array).__name__}")
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must hold integers (int64), got dtype {array.dtype}")
    if array.ndim != 2:
        raise ValueError(f"{name} must be 2-D (batch, sequence), got shape {array.shape}")
    return np.ascontiguousarray(array, dtype=np.int64)


__all__ = ["OnnxBackend"]
