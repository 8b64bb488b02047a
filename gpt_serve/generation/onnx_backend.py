"""The ONNX Runtime backend of the generation engine: torch-free inference from a model folder's ONNX export.

This module imports only numpy, onnxruntime, the standard library and the torch-free parts of gpt_serve (vocab,
engine, sampling, models), so numpy and onnxruntime are enough to generate text, and torch is never imported
even where it is installed (an import-linter contract and a test check both):

    >>> from gpt_serve.generation import SamplingParams, stream_text
    >>> from gpt_serve.generation.onnx_backend import OnnxBackend
    >>> backend = OnnxBackend("shakespeare", quantized=True, threads=2)
    >>> for piece in stream_text(backend, backend.vocab, "ROMEO:", 200, SamplingParams(0.8), seed=0):
    ...     print(piece, end="")

`gpt_serve.generation.load_backend("shakespeare", "onnx-int8")` is the usual way in.

It is also the one place that names the ONNX layout (file names, graph inputs/outputs, metadata keys); the
exporter (`python -m export`) imports these names from here. The layout is Hugging Face's: the graphs live in
`MODEL_DIR/onnx/` next to `config.json` and `vocab.json`, and a decoder graph takes `input_ids`,
`attention_mask`, `position_ids`, `past_key_values.{i}.key/.value` and returns `logits`, `present.{i}.key/.value`.
One graph serves prefill (an empty past) and decode. Beside it, the export writes an in-place decode graph for
ONNX Runtime (`onnx/decoder_inplace*.onnx`: `run_inplace`, `OnnxInPlaceBatch`), which this backend prefills and
decodes with where the folder has it; the browser, onnxruntime-genai and other runtimes read the first.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from ..models import model_path, read_config
from ..vocab import VOCAB_FILE_NAME, CharVocab
from .threads import check_threads

logger = logging.getLogger(__name__)

ONNX_SUBDIR = "onnx"
FP32_FILE_NAME = "model.onnx"
INT8_FILE_NAME = "model_quantized.onnx"
# The decode graph with a cache updated in place, beside the Hugging Face layout graph (see `OnnxInPlaceBatch`).
INPLACE_FP32_FILE_NAME = "decoder_inplace.onnx"
INPLACE_INT8_FILE_NAME = "decoder_inplace_quantized.onnx"
INPLACE_INPUT_NAMES = ("input_ids", "position_ids", "cache_lengths")
INPLACE_FORMAT = "chargpt-decoder-inplace"
INPUT_NAMES = ("input_ids", "attention_mask", "position_ids")
LOGITS_NAME = "logits"
# Metadata stored in the ONNX file (`metadata_props`), all as strings.
ONNX_FORMAT = "chargpt-decoder-with-past"
ONNX_FORMAT_VERSION = "1"
REQUIRED_METADATA = (
    "format",
    "format_version",
    "exporter_version",
    "block_size",
    "vocab_size",
    "vocab_sha256",
    "n_layer",
    "n_head",
    "head_size",
)
# config.json entries that must agree with the ONNX metadata (a stale export of an older architecture).
CONFIG_KEYS_CHECKED = ("block_size", "vocab_size", "n_layer", "n_head")
WEIGHTS_FILE_NAME = "model.safetensors"
EXPORT_HINT = "export it with `python -m export {model_dir}` (or `gpt-serve export {model_dir}`)"


# The cache's input and output names (Hugging Face's decoder layout), by layer and kind ("key" or "value").
PAST_NAME = "past_key_values.{layer}.{kind}"
PRESENT_NAME = "present.{layer}.{kind}"


# The in-place graph's cache inputs: buffers with every row's keys/values at columns [0, cache_lengths[row]). Its
# outputs after the logits are `present_names`, the same buffers with the new tokens' columns written (bound to the
# inputs' memory, they are the inputs).
CACHE_NAME = "cache.{layer}.{kind}"


def cache_names(n_layer: int) -> list[str]:
    """The in-place graph's cache inputs in graph order: cache.0.key, cache.0.value, cache.1.key, ..."""
    return [CACHE_NAME.format(layer=i, kind=kind) for i in range(n_layer) for kind in ("key", "value")]


def past_names(n_layer: int) -> list[str]:
    """Cache inputs in graph order: past_key_values.0.key, past_key_values.0.value, past_key_values.1.key, ..."""
    return [PAST_NAME.format(layer=i, kind=kind) for i in range(n_layer) for kind in ("key", "value")]


def present_names(n_layer: int) -> list[str]:
    """Cache outputs in graph order, matching `past_names`: present.0.key, present.0.value, ..."""
    return [PRESENT_NAME.format(layer=i, kind=kind) for i in range(n_layer) for kind in ("key", "value")]


def onnx_path(model_dir: str | os.PathLike, quantized: bool = False, inplace: bool = False) -> Path:
    """Where the fp32 (`onnx/model.onnx`) or int8 (`onnx/model_quantized.onnx`) graph of a model folder lives; with
    `inplace`, its in-place decode graph (`onnx/decoder_inplace.onnx`, `onnx/decoder_inplace_quantized.onnx`)."""
    if inplace:
        return Path(model_dir) / ONNX_SUBDIR / (INPLACE_INT8_FILE_NAME if quantized else INPLACE_FP32_FILE_NAME)
    return Path(model_dir) / ONNX_SUBDIR / (INT8_FILE_NAME if quantized else FP32_FILE_NAME)


def weights_sha256(model_dir: str | os.PathLike) -> str | None:
    """sha256 of the folder's `model.safetensors` (None when absent): the ONNX metadata records it, so a folder
    retrained after its export is caught at load time instead of the two backends silently disagreeing."""
    path = Path(model_dir) / WEIGHTS_FILE_NAME
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def session_options(threads: int | None = None, int8_compute: bool = True) -> ort.SessionOptions:
    """SessionOptions for decoding: all graph optimizations, `threads` intra-op threads (None: ORT's default, one per
    physical core), one inter-op thread (the graph is a chain; parallel branches do not pay).

    The int8 file's weights are int8, each read through a `DequantizeLinear` (`export.onnx_export.quantize_int8`).
    With `int8_compute` ONNX Runtime fuses each into a `MatMulNBits` that keeps the weights int8 in memory and
    multiplies them by activations quantized per block of 32 values of a row (rows stay independent); without it,
    it folds them into fp32 weights once, at load, and runs fp32 MatMuls: the arithmetic of the fp32 graph, and of
    the in-browser page (demo/web/model.js asks onnxruntime-web for the same). No effect on the fp32 file."""
    threads = check_threads(threads, "ONNX Runtime's default")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    if not int8_compute:
        options.add_session_config_entry("session.disable_quant_qdq", "1")
    if threads is not None:
        options.intra_op_num_threads = threads
    return options


class UnsupportedGraph(ValueError):
    """This ONNX Runtime has no kernel for an operator of the graph (an older release than the export's)."""


def load_session(
    path: Path, threads: int | None = None, providers=None, int8_compute: bool = True
) -> ort.InferenceSession:
    """An InferenceSession on `path` (`session_options`), with a clear error for a missing, truncated or corrupt
    file, and `UnsupportedGraph` for one this ONNX Runtime has no kernel for."""
    model_dir = path.parent.parent
    if not path.is_file():
        raise FileNotFoundError(f"ONNX model not found: {path}; " + EXPORT_HINT.format(model_dir=model_dir))
    try:
        providers = providers or ["CPUExecutionProvider"]
        return ort.InferenceSession(str(path), session_options(threads, int8_compute), providers=providers)
    except (ort_errors.NotImplemented, ort_errors.Fail) as e:
        message = str(e)
        if isinstance(e, ort_errors.Fail) and "is not a registered function/op" not in message:
            raise _corrupt(path, e) from None
        raise UnsupportedGraph(
            f"onnxruntime {ort.__version__} cannot run {path}: {message.splitlines()[0][:300]}. Upgrade onnxruntime "
            f"(the export was validated with {_exported_with(path)})"
        ) from None
    except (
        ort_errors.InvalidArgument,
        ort_errors.InvalidProtobuf,
        ort_errors.InvalidGraph,
        ort_errors.NoModel,
    ) as e:
        raise _corrupt(path, e) from None


def _corrupt(path: Path, error: Exception) -> ValueError:
    return ValueError(
        f"ONNX Runtime cannot load {path} ({path.stat().st_size} bytes): the file is truncated or corrupt "
        f"({type(error).__name__}: {str(error)[:300]}). Re-" + EXPORT_HINT.format(model_dir=path.parent.parent)
    )


def _exported_with(path: Path) -> str:
    """Which onnxruntime the folder's export report names (its model card), or a generic phrase."""
    card = path.parent.parent / "README.md"
    text = card.read_text(encoding="utf-8", errors="replace") if card.is_file() else ""
    found = re.search(r"onnxruntime (\d+\.\d+\.\d+)", text)
    return f"onnxruntime {found.group(1)}" if found else "a newer onnxruntime"


class OnnxCache:
    """The KV cache between two `OnnxBackend.forward` calls: the graph's `present.*` outputs, kept as ONNX Runtime
    values (never copied to numpy) and fed back as the next call's `past_key_values.*`. Opaque to the engine."""

    __slots__ = ("values", "length", "batch_size", "owner")

    def __init__(self, values: list, length: int, batch_size: int, owner: OnnxBackend):
        self.values, self.length, self.batch_size, self.owner = values, length, batch_size, owner


class OnnxBackend:
    """Runs a model folder's ONNX export for the generation engine (`gpt_serve.generation.engine`), without torch.

    Args:
        model_dir: a model folder (holding `config.json`, `vocab.json` and `onnx/`), or the name of a shipped model
            (see `gpt_serve.models.list_models`).
        quantized: load `onnx/model_quantized.onnx` (int8 weights) instead of `onnx/model.onnx` (fp32).
        int8_compute: for the int8 file, ONNX Runtime's int8 kernel (the weights stay int8 in memory: faster where
            they do not fit in the CPU's cache); False dequantizes them once at load and computes in fp32, as the
            in-browser page does (the same greedy tokens). See `session_options`.
        threads: intra-op threads (None: ONNX Runtime's default, one per physical core).
        providers: ONNX Runtime execution providers (default `["CPUExecutionProvider"]`). With the CUDA provider
            first, the KV cache stays on the GPU between steps.
        inplace: decode with the folder's in-place decode graph where it has one (`onnx/decoder_inplace*.onnx`,
            written by `python -m export` since it exists; see `OnnxInPlaceBatch`); False, or a folder without it:
            every step runs the Hugging Face layout graph.

    Raises:
        FileNotFoundError: the ONNX file (or `vocab.json`) is missing.
        ValueError: the ONNX file (or the in-place graph beside it) is truncated or corrupt, was not written by
            `python -m export`, or does not match the folder's vocabulary, config or main graph.
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        quantized: bool = False,
        threads: int | None = None,
        providers=None,
        int8_compute: bool = True,
        inplace: bool = True,
    ):
        self.model_dir = model_path(str(model_dir))
        self.quantized = bool(quantized)
        self.path = onnx_path(self.model_dir, self.quantized)
        self.session = load_session(self.path, threads, providers, int8_compute)
        self.metadata = dict(self.session.get_modelmeta().custom_metadata_map)
        self._check_metadata(self.path, self.metadata, ONNX_FORMAT)
        self.block_size = int(self.metadata["block_size"])
        self.vocab_size = int(self.metadata["vocab_size"])
        self.n_layer = int(self.metadata["n_layer"])
        self.n_head = int(self.metadata["n_head"])
        self.head_size = int(self.metadata["head_size"])
        self.vocab = CharVocab.from_file(self.model_dir / VOCAB_FILE_NAME)
        self._check_vocab_and_config()
        self._check_graph_io()
        self._past_names = past_names(self.n_layer)
        self._present_names = present_names(self.n_layer)
        first = self.session.get_providers()[0]
        self._cache_device = "cuda" if first == "CUDAExecutionProvider" else "cpu"
        self._empty_past: dict[int, Any] = {}  # batch size -> an empty (B, H, 0, head_size) past, made once
        self.inplace_path = onnx_path(self.model_dir, self.quantized, inplace=True)
        self.inplace_session = None
        if inplace and self._cache_device == "cpu" and self.inplace_path.is_file():
            try:
                self.inplace_session = load_session(self.inplace_path, threads, providers, int8_compute)
            except UnsupportedGraph as e:  # an ONNX Runtime without the graph's GroupQueryAttention kernel
                logger.warning("%s; decoding with the Hugging Face layout graph meanwhile", e)
        if self.inplace_session is not None:
            self._check_inplace_graph()
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

    def _check_metadata(self, path: Path, metadata: dict[str, str], expected_format: str) -> None:
        missing = [k for k in REQUIRED_METADATA if k not in metadata]
        if missing:
            raise ValueError(
                f"{path} lacks the metadata {missing} that `python -m export` writes (block size, vocabulary "
                f"hash, ...); it was not exported by gpt-serve. Re-" + EXPORT_HINT.format(model_dir=self.model_dir)
            )
        if (metadata["format"], metadata["format_version"]) != (expected_format, ONNX_FORMAT_VERSION):
            raise ValueError(
                f"{path} has ONNX format {metadata['format']!r} version {metadata['format_version']!r}; "
                f"this gpt_serve reads {expected_format!r} version {ONNX_FORMAT_VERSION!r} there. Re-"
                + EXPORT_HINT.format(model_dir=self.model_dir)
            )

    def _check_inplace_graph(self) -> None:
        """The in-place graph must come from the same export as the main graph (same weights, vocabulary and
        shapes: its metadata equal but for the format) and have the in-place inputs and outputs."""
        path, metadata = self.inplace_path, dict(self.inplace_session.get_modelmeta().custom_metadata_map)
        self._check_metadata(path, metadata, INPLACE_FORMAT)
        differ = sorted(
            k for k in set(metadata) | set(self.metadata) if k != "format" and metadata.get(k) != self.metadata.get(k)
        )
        if differ:
            raise ValueError(
                f"{path} and {self.path} come from different exports (their metadata differ in {differ}): the "
                f"folder mixes files of two models or two exports. Re-" + EXPORT_HINT.format(model_dir=self.model_dir)
            )
        _check_io(self.inplace_session, path, [*INPLACE_INPUT_NAMES, *cache_names(self.n_layer)], INPLACE_INPUT_NAMES)

    def _check_vocab_and_config(self) -> None:
        vocab_file = self.model_dir / VOCAB_FILE_NAME
        if self.vocab.sha256 != self.metadata["vocab_sha256"] or len(self.vocab) != self.vocab_size:
            raise ValueError(
                f"vocabulary mismatch: {vocab_file} has {len(self.vocab)} characters (sha256 "
                f"{self.vocab.sha256[:12]}...) but {self.path} was exported with a {self.vocab_size}-character "
                f"vocabulary (sha256 {self.metadata['vocab_sha256'][:12]}...). The ids would decode to the wrong "
                f"characters: use the vocab.json the model was trained with, or re-"
                + EXPORT_HINT.format(model_dir=self.model_dir)
            )
        config_file = self.model_dir / "config.json"
        config = read_config(self.model_dir)
        onnx_values = {k: int(self.metadata[k]) for k in CONFIG_KEYS_CHECKED}
        stale = {k: (config.get(k), v) for k, v in onnx_values.items() if config.get(k) != v}
        if stale:
            shown = ", ".join(f"{k}: config.json {c}, ONNX {o}" for k, (c, o) in stale.items())
            raise ValueError(
                f"{self.path} does not match {config_file} ({shown}): the export is stale. Re-"
                + EXPORT_HINT.format(model_dir=self.model_dir)
            )
        exported_from = self.metadata.get("weights_sha256")
        if exported_from:  # a folder shipped with the ONNX files only (no safetensors) skips this check
            current = weights_sha256(self.model_dir)
            if current is not None and current != exported_from:
                raise ValueError(
                    f"{self.path} was exported from other weights than {self.model_dir / WEIGHTS_FILE_NAME} (sha256 "
                    f"{exported_from[:12]}... at export, {current[:12]}... now): the export is stale. Re-"
                    + EXPORT_HINT.format(model_dir=self.model_dir)
                )

    def _check_graph_io(self) -> None:
        _check_io(self.session, self.path, [*INPUT_NAMES, *past_names(self.n_layer)], INPUT_NAMES)

    def new_batch(self, max_rows: int) -> OnnxInPlaceBatch | OnnxDecodeBatch:
        """An empty batch of at most `max_rows` rows for the scheduler (`gpt_serve.generation.scheduler`): on the
        in-place graph where the folder has one, else on the Hugging Face layout graph."""
        if self.inplace_session is not None:
            return OnnxInPlaceBatch(self, max_rows)
        return OnnxDecodeBatch(self, max_rows)

    def run_inplace(self, input_ids: np.ndarray, lengths: np.ndarray, cache: list[np.ndarray]) -> np.ndarray:
        """`run_inplace` on this backend's in-place graph, with the ids checked (a sampled or prompt id outside the
        vocabulary would otherwise be embedded as some other row of the table)."""
        self._check_vocabulary(input_ids)
        return run_inplace(self.inplace_session, input_ids, lengths, cache)

    def _check_vocabulary(self, ids: np.ndarray) -> None:
        bad = ids[(ids < 0) | (ids >= self.vocab_size)]
        if bad.size:
            raise ValueError(
                f"input_ids holds ids {np.unique(bad)[:10].tolist()} outside the vocabulary [0, {self.vocab_size - 1}]"
            )

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
        binding.bind_cpu_input("input_ids", input_ids)
        binding.bind_cpu_input("attention_mask", attention_mask)
        binding.bind_cpu_input("position_ids", position_ids)
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
        self._check_vocabulary(input_ids[attention_mask[:, -T:] != 0])  # padding positions may hold any id
        if position_ids.min() < 0 or position_ids.max() >= self.block_size:
            raise ValueError(
                f"position_ids must lie in [0, block_size) = [0, {self.block_size}), got "
                f"[{position_ids.min()}, {position_ids.max()}]; the engine slides the window past block_size"
            )


class OnnxDecodeBatch:
    """Rows decoding together on an `OnnxBackend` (see `gpt_serve.generation.scheduler.DecodeBatch`).

    The rows share one left-padded cache in the graph's Hugging Face layout: row r's keys are the last
    `lengths[r]` of the cache's columns, `mask` says which columns are whose, and a step appends one column for
    every row (the graph's `present = Concat(past, new)`). A new row is prefilled alone and joins padded to the
    others' width; a row that leaves is replaced by the last one. Columns no row uses any more are cut off when a
    row leaves, or once `TRIM_COLUMNS` of them have piled up.
    """

    TRIM_COLUMNS = 16

    def __init__(self, backend: OnnxBackend, max_rows: int):
        self.backend, self.max_rows = backend, max_rows
        self._set([], np.zeros((0, 0), dtype=np.int64), np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.lengths)

    def _set(self, arrays: list[np.ndarray], mask: np.ndarray, lengths: np.ndarray) -> None:
        self._arrays = [np.ascontiguousarray(a) for a in arrays]  # kept alive: the OrtValues point into them
        values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self._arrays]
        self.cache = OnnxCache(values, mask.shape[1], len(lengths), self.backend) if len(lengths) else None
        self.mask, self.lengths = mask, lengths

    def _numpy(self) -> list[np.ndarray]:
        return [v.numpy() for v in self.cache.values] if self.cache is not None else []

    def _trimmed(self, arrays, mask, lengths):
        unused = mask.shape[1] - (int(lengths.max()) if len(lengths) else 0)
        return [a[:, :, unused:] for a in arrays], mask[:, unused:], lengths

    def add(self, ids) -> np.ndarray:
        if len(self) >= self.max_rows:
            raise ValueError(f"the batch holds {self.max_rows} rows at most")
        ids = np.asarray(ids, dtype=np.int64)[None]  # (1, L)
        L = ids.shape[1]
        logits, cache = self.backend.forward(ids, np.ones_like(ids), np.arange(L)[None], None)
        new = [v.numpy() for v in cache.values]  # each (1, H, L, hs)
        width = max(self.mask.shape[1], L)
        pad = lambda a, w: np.pad(a, ((0, 0), (0, 0), (width - w, 0), (0, 0)))  # noqa: E731  (left, on columns)
        if len(self):
            old = self._numpy()
            arrays = [np.concatenate([pad(o, self.mask.shape[1]), pad(n, L)]) for o, n in zip(old, new, strict=True)]
        else:
            arrays = [pad(n, L) for n in new]
        mask = np.zeros((len(self) + 1, width), dtype=np.int64)
        mask[:-1, width - self.mask.shape[1] :] = self.mask
        mask[-1, width - L :] = 1
        self._set(arrays, mask, np.append(self.lengths, L))
        return logits[0]

    def remove(self, row: int) -> None:
        if not 0 <= row < len(self):
            raise IndexError(f"no row {row} in a batch of {len(self)}")
        order = list(range(len(self)))
        order[row] = order[-1]  # the last row takes its place
        order.pop()
        arrays = [a[order] for a in self._numpy()]
        self._set(*self._trimmed(arrays, self.mask[order], self.lengths[order]))

    def step(self, tokens: np.ndarray) -> np.ndarray:
        n = len(self)
        mask = np.concatenate([self.mask, np.ones((n, 1), dtype=np.int64)], axis=1)
        tokens = np.ascontiguousarray(tokens, dtype=np.int64)[:, None]
        logits, self.cache = self.backend.forward(tokens, mask, self.lengths[:, None].copy(), self.cache)
        self.mask, self.lengths = mask, self.lengths + 1
        if mask.shape[1] - int(self.lengths.max()) >= self.TRIM_COLUMNS:
            self._set(*self._trimmed(self._numpy(), self.mask, self.lengths))
        return logits


class OnnxInPlaceBatch:
    """Rows decoding together on an `OnnxBackend`'s in-place graph (see `gpt_serve.generation.scheduler.DecodeBatch`).

    Every row's keys/values live in buffers allocated once, per layer (max_rows, H, block_size, head_size): row r's
    window positions 0..L-1 in columns 0..L-1 (a window always starts at position 0, so no row needs padding). A
    step hands the first `len(self)` rows of the buffers to the graph as they are (a contiguous view) and ONNX
    Runtime writes each row's new column into them; a new row is prefilled alone straight into its row of the
    buffers; a row that leaves is replaced by the last one (one row copied). Nothing is concatenated or rebuilt,
    and the attention reads each row's own columns only. A scheduler on it runs one ONNX Runtime session (full
    windows too: `OnnxBackend.window_logits`).
    """

    def __init__(self, backend: OnnxBackend, max_rows: int):
        self.backend, self.max_rows = backend, max_rows
        shape = (max_rows, backend.n_head, backend.block_size, backend.head_size)
        self.cache = [np.zeros(shape, dtype=np.float32) for _ in range(2 * backend.n_layer)]
        self.lengths = np.zeros(max_rows, dtype=np.int64)
        self.rows = 0

    def __len__(self) -> int:
        return self.rows

    def add(self, ids) -> np.ndarray:
        if self.rows >= self.max_rows:
            raise ValueError(f"the batch holds {self.max_rows} rows at most")
        ids = np.asarray(ids, dtype=np.int64)[None]  # (1, L)
        L, row = ids.shape[1], self.rows
        if not 0 < L <= self.backend.block_size:
            raise ValueError(f"a row holds 1 to block_size = {self.backend.block_size} tokens, got {L}")
        rows = [buffer[row : row + 1] for buffer in self.cache]
        logits = self.backend.run_inplace(ids, np.zeros(1, dtype=np.int64), rows)  # a prefill, alone, in place
        self.lengths[row] = L
        self.rows += 1
        return logits[0]

    def remove(self, row: int) -> None:
        if not 0 <= row < self.rows:
            raise IndexError(f"no row {row} in a batch of {self.rows}")
        last = self.rows - 1
        if row != last:  # the last row takes its place
            used = int(self.lengths[last])
            for buffer in self.cache:
                buffer[row, :, :used] = buffer[last, :, :used]
            self.lengths[row] = self.lengths[last]
        self.rows = last

    def step(self, tokens: np.ndarray) -> np.ndarray:
        n = self.rows
        lengths = self.lengths[:n].copy()
        if n and lengths.max() >= self.backend.block_size:
            raise ValueError(
                f"a row already holds block_size = {self.backend.block_size} tokens: slide its window first"
            )
        tokens = np.ascontiguousarray(tokens, dtype=np.int64).reshape(-1, 1)
        if len(tokens) != n:
            raise ValueError(f"step takes one token per row: {n} rows, got {len(tokens)} tokens")
        logits = self.backend.run_inplace(tokens, lengths, [buffer[:n] for buffer in self.cache])
        self.lengths[:n] += 1
        return logits


def _check_io(session: ort.InferenceSession, path: Path, expected_inputs: list[str], int_inputs) -> None:
    """The graph's inputs are `expected_inputs` (`int_inputs` among them int64) and its outputs the logits and the
    `present.*` of its layers."""
    inputs = {i.name: i.type for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    n_layer = sum(name.endswith(".key") for name in expected_inputs)
    expected_outputs = [LOGITS_NAME, *present_names(n_layer)]
    if sorted(inputs) != sorted(expected_inputs) or outputs != expected_outputs:
        raise ValueError(
            f"{path} has inputs {sorted(inputs)} and outputs {outputs}; expected inputs {expected_inputs} "
            f"and outputs {expected_outputs}"
        )
    for name in int_inputs:
        if inputs[name] != "tensor(int64)":
            raise ValueError(f"{path}: input {name!r} is {inputs[name]}, expected tensor(int64)")


def run_inplace(session: ort.InferenceSession, input_ids: np.ndarray, lengths: np.ndarray, cache: list) -> np.ndarray:
    """T new tokens per row through an in-place graph (`session`), their keys/values written into `cache` in place.

    `input_ids` int64 (rows, T) at positions `lengths[b] .. + T - 1`; `lengths` int64 (rows,) each row's cached
    tokens; `cache` the graph's `cache.*` buffers in `cache_names` order, C-contiguous float32 (rows, H, columns,
    head_size) with row b's keys in columns `[0, lengths[b])` and room for T more. Returns the logits (rows, V) of
    each row's last token; the new columns are in `cache`: each `present.*` output is bound to its input's memory
    (ONNX Runtime would copy a buffer that is not contiguous, and the write would be lost: refused here)."""
    rows, T = input_ids.shape
    if lengths.shape != (rows,) or any(a.dtype != np.float32 or not a.flags.c_contiguous for a in cache):
        raise ValueError(
            f"run_inplace needs lengths of shape ({rows},) and C-contiguous float32 cache buffers, got lengths "
            f"{lengths.shape} and buffers {[(a.dtype.name, a.flags.c_contiguous) for a in cache]}"
        )
    binding = session.io_binding()
    binding.bind_cpu_input("input_ids", np.ascontiguousarray(input_ids, dtype=np.int64))
    binding.bind_cpu_input("position_ids", lengths[:, None] + np.arange(T))
    binding.bind_cpu_input("cache_lengths", np.ascontiguousarray(lengths, dtype=np.int64))
    binding.bind_output(LOGITS_NAME, "cpu")  # first: get_outputs() is in binding order
    n_layer = len(cache) // 2
    for name, present, array in zip(cache_names(n_layer), present_names(n_layer), cache, strict=True):
        value = ort.OrtValue.ortvalue_from_numpy(array)  # the numpy buffer's own memory, not a copy
        binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(present, value)  # written in place
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()


def _as_int64(name: str, array: Any) -> np.ndarray:
    """`array` as a contiguous 2-D int64 array; any integer dtype is accepted, anything else is a TypeError."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy array of int64, got {type(array).__name__}")
    if not np.issubdtype(array.dtype, np.integer):
        raise TypeError(f"{name} must hold integers (int64), got dtype {array.dtype}")
    if array.ndim != 2:
        raise ValueError(f"{name} must be 2-D (batch, sequence), got shape {array.shape}")
    return np.ascontiguousarray(array, dtype=np.int64)


__all__ = [
    "OnnxBackend",
    "OnnxCache",
    "OnnxInPlaceBatch",
    "INPLACE_FP32_FILE_NAME",
    "INPLACE_INT8_FILE_NAME",
    "INPLACE_FORMAT",
    "INPLACE_INPUT_NAMES",
    "cache_names",
    "run_inplace",
    "UnsupportedGraph",
    "onnx_path",
    "weights_sha256",
    "past_names",
    "present_names",
    "session_options",
    "load_session",
    "ONNX_SUBDIR",
    "PAST_NAME",
    "PRESENT_NAME",
    "FP32_FILE_NAME",
    "INT8_FILE_NAME",
    "INPUT_NAMES",
    "LOGITS_NAME",
    "ONNX_FORMAT",
    "ONNX_FORMAT_VERSION",
    "REQUIRED_METADATA",
]
