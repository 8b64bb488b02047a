"""ONNX Runtime sessions on a model folder's export: options, loading, the checks, and running the in-place graph.

`load_session` opens a graph with a clear error for a missing, corrupt or unsupported file; the `check_*` functions
refuse a graph that breaks the export's contract (`gpt_serve.onnx_contract`: metadata, inputs and outputs) or does
not match the folder beside it (vocabulary, config, weights, the other graph); `run_inplace` binds the in-place
decode graph so that it writes the cache in place. The exporter (`export`) loads and runs its graphs with these
too. Torch-free: numpy, onnxruntime and the standard library.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as ort_errors

from ...chargpt.vocab import VOCAB_FILE_NAME
from ...models import CONFIG_FILE_NAME, WEIGHTS_FILE_NAME
from ...onnx_contract import (
    CACHE_LENGTHS_NAME,
    CONFIG_KEYS_CHECKED,
    FORMAT_KEY,
    FORMAT_VERSION_KEY,
    INPLACE_FORMAT,
    INPLACE_INPUT_NAMES,
    INPUT_IDS_NAME,
    LOGITS_NAME,
    N_LAYER_KEY,
    ONNX_FORMAT_VERSION,
    POSITION_IDS_NAME,
    REQUIRED_METADATA,
    VOCAB_SHA256_KEY,
    VOCAB_SIZE_KEY,
    WEIGHTS_SHA256_KEY,
    cache_names,
    present_names,
)
from ..model_folder import ModelFolder
from .threads import check_threads

EXPORT_HINT = "export it with `python -m export {model_dir}` (or `gpt-serve export {model_dir}`)"


def session_options(threads: int | None = None, int8_compute: bool = True) -> ort.SessionOptions:
    """SessionOptions for decoding: all graph optimizations, `threads` intra-op threads (None: ORT's default, one per
    physical core), one inter-op thread (the graph is a chain; parallel branches do not pay).

    The int8 file's weights are int8, each read through a `DequantizeLinear` (`export.graph_rewrites.quantize_int8`).
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
    if not path.is_file():
        raise FileNotFoundError(f"ONNX model not found: {path}; " + _export_hint(path))
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


def _export_hint(path: Path) -> str:
    """How to re-export the model folder of the graph file at `path` (`MODEL_DIR/onnx/FILE`)."""
    return EXPORT_HINT.format(model_dir=path.parent.parent)


def _corrupt(path: Path, error: Exception) -> ValueError:
    return ValueError(
        f"ONNX Runtime cannot load {path} ({path.stat().st_size} bytes): the file is truncated or corrupt "
        f"({type(error).__name__}: {str(error)[:300]}). Re-" + _export_hint(path)
    )


def _exported_with(path: Path) -> str:
    """Which onnxruntime the folder's export report names (its model card), or a generic phrase."""
    card = path.parent.parent / "README.md"
    text = card.read_text(encoding="utf-8", errors="replace") if card.is_file() else ""
    found = re.search(r"onnxruntime (\d+\.\d+\.\d+)", text)
    return f"onnxruntime {found.group(1)}" if found else "a newer onnxruntime"


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


def check_metadata(path: Path, metadata: dict[str, str], expected_format: str) -> None:
    """The graph at `path` carries the metadata `python -m export` writes, in `expected_format`."""
    missing = [k for k in REQUIRED_METADATA if k not in metadata]
    if missing:
        raise ValueError(
            f"{path} lacks the metadata {missing} that `python -m export` writes (block size, vocabulary "
            f"hash, ...); it was not exported by gpt-serve. Re-" + _export_hint(path)
        )
    if (metadata[FORMAT_KEY], metadata[FORMAT_VERSION_KEY]) != (expected_format, ONNX_FORMAT_VERSION):
        raise ValueError(
            f"{path} has ONNX format {metadata[FORMAT_KEY]!r} version {metadata[FORMAT_VERSION_KEY]!r}; "
            f"this gpt_serve reads {expected_format!r} version {ONNX_FORMAT_VERSION!r} there. Re-" + _export_hint(path)
        )


def check_folder(path: Path, metadata: dict[str, str], folder: ModelFolder) -> None:
    """The graph at `path` (its `metadata`) was exported from `folder`'s vocabulary, config and weights."""
    model_dir, vocab, config = folder.path, folder.vocab, folder.config
    vocab_file, vocab_size = model_dir / VOCAB_FILE_NAME, int(metadata[VOCAB_SIZE_KEY])
    if vocab.sha256 != metadata[VOCAB_SHA256_KEY] or len(vocab) != vocab_size:
        raise ValueError(
            f"vocabulary mismatch: {vocab_file} has {len(vocab)} characters (sha256 "
            f"{vocab.sha256[:12]}...) but {path} was exported with a {vocab_size}-character "
            f"vocabulary (sha256 {metadata[VOCAB_SHA256_KEY][:12]}...). The ids would decode to the wrong "
            f"characters: use the vocab.json the model was trained with, or re-" + _export_hint(path)
        )
    config_file = model_dir / CONFIG_FILE_NAME
    onnx_values = {k: int(metadata[k]) for k in CONFIG_KEYS_CHECKED}
    stale = {k: (config.get(k), v) for k, v in onnx_values.items() if config.get(k) != v}
    if stale:
        shown = ", ".join(f"{k}: config.json {c}, ONNX {o}" for k, (c, o) in stale.items())
        raise ValueError(
            f"{path} does not match {config_file} ({shown}): the export is stale. Re-" + _export_hint(path)
        )
    exported_from = metadata.get(WEIGHTS_SHA256_KEY)
    if exported_from:  # a folder shipped with the ONNX files only (no safetensors) skips this check
        current = weights_sha256(model_dir)
        if current is not None and current != exported_from:
            raise ValueError(
                f"{path} was exported from other weights than {model_dir / WEIGHTS_FILE_NAME} (sha256 "
                f"{exported_from[:12]}... at export, {current[:12]}... now): the export is stale. Re-"
                + _export_hint(path)
            )


def check_inplace_graph(session: ort.InferenceSession, path: Path, main_path: Path, main_metadata: dict) -> None:
    """The in-place graph (`session` on `path`) must come from the same export as the main graph at `main_path` (same
    weights, vocabulary and shapes: its metadata equal but for the format) and have the in-place inputs and outputs."""
    metadata = dict(session.get_modelmeta().custom_metadata_map)
    check_metadata(path, metadata, INPLACE_FORMAT)
    differ = sorted(
        k for k in set(metadata) | set(main_metadata) if k != FORMAT_KEY and metadata.get(k) != main_metadata.get(k)
    )
    if differ:
        raise ValueError(
            f"{path} and {main_path} come from different exports (their metadata differ in {differ}): the "
            f"folder mixes files of two models or two exports. Re-" + _export_hint(path)
        )
    n_layer = int(main_metadata[N_LAYER_KEY])
    check_io(session, path, [*INPLACE_INPUT_NAMES, *cache_names(n_layer)], INPLACE_INPUT_NAMES)


def check_io(session: ort.InferenceSession, path: Path, expected_inputs: list[str], int_inputs) -> None:
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
    binding.bind_cpu_input(INPUT_IDS_NAME, np.ascontiguousarray(input_ids, dtype=np.int64))
    binding.bind_cpu_input(POSITION_IDS_NAME, lengths[:, None] + np.arange(T))
    binding.bind_cpu_input(CACHE_LENGTHS_NAME, np.ascontiguousarray(lengths, dtype=np.int64))
    binding.bind_output(LOGITS_NAME, "cpu")  # first: get_outputs() is in binding order
    n_layer = len(cache) // 2
    for name, present, array in zip(cache_names(n_layer), present_names(n_layer), cache, strict=True):
        value = ort.OrtValue.ortvalue_from_numpy(array)  # the numpy buffer's own memory, not a copy
        binding.bind_ortvalue_input(name, value)
        binding.bind_ortvalue_output(present, value)  # written in place
    session.run_with_iobinding(binding)
    return binding.get_outputs()[0].numpy()
