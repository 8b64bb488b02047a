"""`export_model`: a model folder in, validated ONNX graphs in its `onnx/` folder out, with a report.

The graphs are written to a temporary folder next to the model, checked (see `export.validate`), and moved into
`MODEL_DIR/onnx/` only when every check passes, so a failed export never replaces a working one. The model card
(`MODEL_DIR/README.md`) then gets its ONNX section. Nothing is written through a symbolic link (`gpt_serve.files`):
a folder whose `README.md`, `onnx/` or `onnx/*` file is a link is refused before the export starts.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from gpt_serve.chargpt.vocab import CharVocab
from gpt_serve.files import folder_to_write, refuse_link
from gpt_serve.folders.corpus import train_val_split
from gpt_serve.generation import ModelFolder, load_backend
from gpt_serve.generation.backends.onnx_session import load_session, weights_sha256
from gpt_serve.generation.folder_defaults import read_generation_defaults
from gpt_serve.models import ONNX_FILE_NAMES
from gpt_serve.onnx_contract import (
    FP32_FILE_NAME,
    INPLACE_FP32_FILE_NAME,
    INPLACE_INT8_FILE_NAME,
    INT8_FILE_NAME,
    ONNX_SUBDIR,
)

from .genai import write_genai_files
from .graph_rewrites import quantize_int8
from .onnx_export import (
    EXPORTER,
    EXPORTER_VERSION,
    OPSET,
    export_fp32,
    export_inplace_fp32,
    metadata,
    write_metadata,
)
from .validate import (
    FP32_LOGITS_ATOL,
    INT8_MAX_VAL_LOSS_INCREASE,
    ParityResult,
    check_graph,
    compare_inplace_with_main,
    compare_inplace_with_torch,
    compare_with_torch,
    eval_windows,
    onnx_val_loss,
)

logger = logging.getLogger(__name__)
WORK_PREFIX = ".onnx-export-"  # the temporary folder the graphs are written to and checked in, inside the model's


@dataclass
class ValLoss:
    """Validation loss of the fp32 and int8 graphs on the same windows of real text."""

    source: str
    tokens: int
    fp32: float
    int8: float
    max_increase: float

    @property
    def increase(self) -> float:
        return self.int8 - self.fp32

    @property
    def passed(self) -> bool:
        return self.increase <= self.max_increase


@dataclass
class ExportReport:
    model_dir: Path
    opset: int
    files: dict[str, int] = field(default_factory=dict)  # path relative to model_dir -> bytes
    sha256: dict[str, str] = field(default_factory=dict)  # path relative to model_dir -> the file's sha256
    # `parity`, `checker`: by graph, "fp32" and "int8" (the Hugging Face layout) and "fp32 in-place", "int8 in-place"
    seconds: dict[str, float] = field(default_factory=dict)  # export, quantize, validate
    checker: dict[str, str] = field(default_factory=dict)  # weights -> "ok" or the checker's error
    parity: dict[str, ParityResult] = field(default_factory=dict)  # weights -> ONNX Runtime vs PyTorch
    val_loss: ValLoss | None = None
    int8_inplace_vs_int8: float | None = None  # max |Δlogits|, both int8 graphs with their weights folded to fp32
    atol: float = FP32_LOGITS_ATOL
    failures: list[str] = field(default_factory=list)
    installed: bool = False
    exporter: str = EXPORTER
    exporter_version: str = EXPORTER_VERSION
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.failures


def validation_ids(text: str, vocab: CharVocab) -> np.ndarray:
    """The validation split of `text` as ids, split exactly as training splits it (`gpt_serve.folders.corpus`)."""
    return np.asarray(vocab.encode(train_val_split(text)[1]), dtype=np.int64)


class NotTheTrainingText(ValueError):
    """The validation text has characters outside the model's vocabulary (`check_text_fits`); an application adds
    how its user passes the right text."""


def check_text_fits(text: str, text_source: str, vocab: CharVocab) -> None:
    """A `NotTheTrainingText` (a ValueError) when `text` has characters outside the model's vocabulary: it is not the
    text the model was trained on (the vocabulary is every character of that text), so its loss would say nothing."""
    count, first = vocab.unknown(text, shown=5)
    if count:
        shown = ", ".join(f"{c!r} at {i}" for i, c in first)
        raise NotTheTrainingText(
            f"the validation text {text_source} has {count:,} characters outside this model's vocabulary of "
            f"{len(vocab)} ({shown}{', ...' if count > len(first) else ''}): it is not the text this model was trained "
            f"on, so its loss would say nothing of the int8 graph"
        )


def export_model(
    model_dir: str | os.PathLike | ModelFolder,
    text: str | None = None,
    text_source: str = "validation text",
    quantize: bool = True,
    opset: int = OPSET,
    decode_steps: int = 4,
    atol: float = FP32_LOGITS_ATOL,
    int8_max_loss_increase: float = INT8_MAX_VAL_LOSS_INCREASE,
    val_tokens: int = 32768,
    threads: int | None = None,
) -> ExportReport:
    """Exports, validates and (if every check passes) installs `MODEL_DIR/onnx/model.onnx` and, with `quantize`,
    `MODEL_DIR/onnx/model_quantized.onnx`, with what onnxruntime-genai reads beside them (`export.genai`); and the
    in-place decode graphs that `OnnxBackend` decodes with (`onnx/decoder_inplace.onnx`, with `quantize` also
    `onnx/decoder_inplace_quantized.onnx`; see `export.decoders.DecoderInPlace`).

    Args:
        model_dir: a CharGPT model's `save_pretrained` folder, a shipped model's name, or its opened `ModelFolder`.
        text: the corpus the model was trained on; its validation split (training's split) measures the int8 loss
            change. Required when `quantize`.
        text_source: how the report names `text` (e.g. the file name).
        decode_steps: cached decode steps compared after the prefill.
        atol: the largest |logits difference| accepted between the fp32 graph and PyTorch (and for the cache).
        int8_max_loss_increase: the largest validation-loss increase (nats per character) accepted for int8.
        val_tokens: about how many validation characters the loss is measured on.
        threads: ONNX Runtime intra-op threads for the checks (None: its default).
    """
    if quantize and text is None:
        raise ValueError("the int8 check needs the validation text: pass text= (the training corpus) or quantize=False")
    loaded = load_backend(model_dir, "torch")  # the library's checks of the folder, weights and vocabulary
    folder, vocab, model = loaded.folder.path, loaded.vocab, loaded.backend.pretrained.float()
    check_no_links(folder)
    defaults = read_generation_defaults(folder)  # genai samples as the servers do by default (a bad file: named)
    if quantize:
        check_text_fits(text, text_source, vocab)
    block_size = model.config.block_size
    if isinstance(decode_steps, bool) or not isinstance(decode_steps, int) or not 1 <= decode_steps < block_size:
        raise ValueError(
            f"decode_steps must be an integer in [1, block_size - 1] = [1, {block_size - 1}] (the parity check "
            f"decodes inside the model's window), got {decode_steps!r}"
        )
    remove_stale_work_folders(folder)
    report = ExportReport(folder, opset, atol=atol, versions=_versions())
    work = Path(tempfile.mkdtemp(prefix=WORK_PREFIX, dir=folder))
    try:
        graphs = _write_graphs(model, vocab, weights_sha256(folder), work, quantize, opset, report)
        graph_file = graphs["int8" if quantize else "fp32"].name
        extras = write_genai_files(work, model.config, vocab, graph_file, text, defaults)
        start = time.perf_counter()
        sessions = _check_graphs(model, graphs, decode_steps, atol, threads, report)
        if quantize and report.passed:
            _check_int8_loss(model, vocab, sessions, text, text_source, int8_max_loss_increase, val_tokens, report)
        report.seconds["validate"] = time.perf_counter() - start
        del sessions
        if report.passed:
            _install(folder / ONNX_SUBDIR, [*graphs.values(), *extras], quantize, report)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


def check_no_links(folder: Path) -> None:
    """A ValueError naming the first path the export would write that is a symbolic link: the card, `onnx/`, or a file
    in it (`gpt_serve.files`: nothing is written through a link, whose target may be outside the folder)."""
    for path in (folder / "README.md", folder / ONNX_SUBDIR, *(folder / ONNX_SUBDIR / n for n in ONNX_FILE_NAMES)):
        refuse_link(path)


def remove_stale_work_folders(folder: Path) -> None:
    """Removes the `.onnx-export-*` work folders an interrupted export (a kill, a power cut) left in `folder`. One
    export per folder at a time: a second one running would lose its work folder."""
    for stale in folder.glob(WORK_PREFIX + "*"):
        if stale.is_dir():
            logger.info("removing %s, left by an interrupted export", stale)
            shutil.rmtree(stale, ignore_errors=True)


def _versions() -> dict[str, str]:
    import onnx

    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": ort.__version__}


INPLACE = " in-place"  # the in-place graphs' suffix in the report's keys


def _write_graphs(model, vocab, source_sha256, work: Path, quantize: bool, opset: int, report) -> dict[str, Path]:
    """Both layouts' fp32 graphs and, with `quantize`, their int8 copies: {report key: path}."""
    files = {"fp32": FP32_FILE_NAME, "fp32" + INPLACE: INPLACE_FP32_FILE_NAME}
    if quantize:
        files.update({"int8": INT8_FILE_NAME, "int8" + INPLACE: INPLACE_INT8_FILE_NAME})
    graphs = {key: work / name for key, name in files.items()}
    start = time.perf_counter()
    for key, export in (("fp32", export_fp32), ("fp32" + INPLACE, export_inplace_fp32)):
        values = metadata(model, vocab, "fp32", source_sha256, opset, inplace=key != "fp32")
        export(model, graphs[key], values, opset)
    report.seconds["export"] = time.perf_counter() - start
    logger.info(
        "exported %s in %.1f s", ", ".join(files[k] for k in graphs if k.startswith("fp32")), report.seconds["export"]
    )
    if quantize:
        start = time.perf_counter()
        for key in ("int8", "int8" + INPLACE):
            quantize_int8(graphs[key.replace("int8", "fp32")], graphs[key])
            write_metadata(graphs[key], metadata(model, vocab, "int8", source_sha256, opset, inplace=key != "int8"))
        report.seconds["quantize"] = time.perf_counter() - start
    for path in graphs.values():
        report.files[f"{ONNX_SUBDIR}/{path.name}"] = path.stat().st_size
        report.sha256[f"{ONNX_SUBDIR}/{path.name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return graphs


def _check_graphs(model, graphs: dict[str, Path], decode_steps: int, atol: float, threads, report: ExportReport):
    """onnx.checker, then ONNX Runtime vs PyTorch. fp32 must match within `atol`; int8 values are reported only."""
    sessions = {}
    for weights, path in graphs.items():
        try:
            check_graph(path)
            report.checker[weights] = "ok"
        except Exception as e:  # the checker raises several types; any of them fails the export
            report.checker[weights] = f"{type(e).__name__}: {e}"
            report.failures.append(f"onnx.checker rejected the {weights} graph: {e}")
            continue
        sessions[weights] = load_session(path, threads)
        inplace = weights.endswith(INPLACE)
        parity = (compare_inplace_with_torch if inplace else compare_with_torch)(model, sessions[weights], decode_steps)
        report.parity[weights] = parity
        if not parity.names_ok:
            outputs = [o.name for o in sessions[weights].get_outputs()]
            report.failures.append(f"{weights} graph outputs are {outputs}, not logits + present.*")
        elif parity.shape_errors:
            report.failures.append(f"{weights} output shapes differ from PyTorch: {'; '.join(parity.shape_errors)}")
        elif weights.startswith("fp32") and not (parity.max_abs_logits <= atol and parity.max_abs_cache <= atol):
            report.failures.append(
                f"{weights} graph differs from PyTorch: max |Δlogits| {parity.max_abs_logits:.2e}, max |Δcache| "
                f"{parity.max_abs_cache:.2e} > {atol:.0e}"
            )
    if "int8" in sessions and "int8" + INPLACE in sessions:
        _check_int8_inplace(model, graphs, atol, threads, report)
    return sessions


def _check_int8_inplace(model, graphs: dict[str, Path], atol: float, threads, report: ExportReport) -> None:
    """The int8 in-place graph against the int8 graph, both with their int8 weights folded to fp32 (the same
    weights in the same arithmetic; ONNX Runtime's int8 kernel would amplify their float rounding): what the
    default `onnx-int8` backend decodes with carries exactly the int8 file's weights, whose loss was checked."""
    main, inplace = (load_session(graphs[w], threads, int8_compute=False) for w in ("int8", "int8" + INPLACE))
    report.int8_inplace_vs_int8 = compare_inplace_with_main(model.config, main, inplace)
    if not report.int8_inplace_vs_int8 <= atol:
        report.failures.append(
            f"the int8 in-place graph differs from the int8 graph (weights folded to fp32): max |Δlogits| "
            f"{report.int8_inplace_vs_int8:.2e} > {atol:.0e}"
        )


def _check_int8_loss(model, vocab, sessions, text, text_source, max_increase, val_tokens, report) -> None:
    config = model.config
    windows = eval_windows(validation_ids(text, vocab), config.block_size, val_tokens)
    dims = (config.n_layer, config.n_head, config.head_size)
    fp32, int8 = (onnx_val_loss(sessions[w], windows, *dims) for w in ("fp32", "int8"))
    report.val_loss = ValLoss(text_source, int(windows[:, 1:].size), fp32, int8, max_increase)
    if not report.val_loss.passed:
        report.failures.append(
            f"int8 raises the validation loss by {report.val_loss.increase:+.4f} ({fp32:.4f} -> {int8:.4f}), "
            f"more than the allowed {max_increase:+.4f}"
        )


def _install(onnx_dir: Path, files: list[Path], quantized: bool, report: ExportReport) -> None:
    folder_to_write(onnx_dir)  # refuses a link (checked before the export too: `check_no_links`)
    for path in files:
        os.replace(path, refuse_link(onnx_dir / path.name))
    if not quantized:  # an fp32-only export leaves no stale int8 graph behind
        (onnx_dir / INT8_FILE_NAME).unlink(missing_ok=True)
        (onnx_dir / INPLACE_INT8_FILE_NAME).unlink(missing_ok=True)
    report.installed = True
