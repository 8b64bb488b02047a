"""The export report, as printed by the CLI and as the "ONNX" section of the model card (`MODEL_DIR/README.md`)."""

from __future__ import annotations

import json
from pathlib import Path

from gpt_serve.files import check_regular, refuse_link, write_file
from gpt_serve.folders.corpus_record import read_corpus_record
from gpt_serve.models import MODELS_DIR

from .exporter import ExportReport

CARD_BEGIN = "<!-- gpt-serve:onnx:begin (written by `python -m export`; edits inside are replaced) -->"
CARD_END = "<!-- gpt-serve:onnx:end -->"


def _mb(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:.2f} MB"


def _parity_line(report: ExportReport, weights: str) -> str:
    p = report.parity[weights]
    if not p.names_ok or p.shape_errors:
        return "names/shapes FAILED"
    rows = ", ".join(map(str, p.batch_lengths))
    if weights.endswith("in-place"):
        return (
            f"max |Δlogits| prefill {p.max_abs_logits_prefill:.1e}, decode {p.max_abs_logits_decode:.1e}; max "
            f"|Δnew keys/values| {p.max_abs_cache:.1e} (rows of {rows} tokens each prefilled alone, then "
            f"{p.decode_steps} decode steps together)"
        )
    return (
        f"max |Δlogits| prefill {p.max_abs_logits_prefill:.1e}, decode {p.max_abs_logits_decode:.1e}; "
        f"max |Δcache| {p.max_abs_cache:.1e} (left-padded batch of rows {rows}, {p.decode_steps} decode steps)"
    )


def format_report(report: ExportReport) -> str:
    """A short plain-text report for the terminal."""
    lines = [f"ONNX export of {report.model_dir}"]
    lines.append(
        f"  exporter       {report.exporter} (opset {report.opset}), {report.exporter_version}, "
        + ", ".join(f"{k} {v}" for k, v in report.versions.items())
    )
    lines.append("  files          " + ", ".join(f"{name} {_mb(size)}" for name, size in report.files.items()))
    lines.append("  time           " + ", ".join(f"{k} {v:.1f} s" for k, v in report.seconds.items()))
    lines.append("  onnx.checker   " + ", ".join(f"{k} {v}" for k, v in report.checker.items()))
    for weights in report.parity:
        rule = f"limit {report.atol:.0e}" if weights.startswith("fp32") else "reported, not checked"
        lines.append(f"  ORT vs torch   {weights}: {_parity_line(report, weights)} [{rule}]")
    if report.int8_inplace_vs_int8 is not None:
        lines.append(
            f"  int8 in-place  vs the int8 graph, weights folded to fp32: max |Δlogits| "
            f"{report.int8_inplace_vs_int8:.1e} [limit {report.atol:.0e}]"
        )
    v = report.val_loss
    if v is not None:
        lines.append(
            f"  int8 val loss  {v.fp32:.4f} (fp32) -> {v.int8:.4f} (int8), {v.increase:+.4f} "
            f"[limit {v.max_increase:+.4f}] on {v.tokens:,} characters of {v.source}"
        )
    for failure in report.failures:
        lines.append(f"  FAILED: {failure}")
    where = f"written to {report.model_dir / 'onnx'}" if report.installed else "nothing written"
    lines.append(f"{'PASS' if report.passed else 'FAIL'}: {where}")
    return "\n".join(lines)


# The card's description of the graphs' inputs and outputs (docs/export.md, "The files", says the same at length)
GRAPHS_LAYOUT = """\
`model*.onnx`: one decoder graph with a KV cache in Hugging Face's layout serves prefill (empty past) and decode.
Inputs `input_ids`, `attention_mask`, `position_ids`, `past_key_values.{i}.key/.value`; outputs `logits`,
`present.{i}.key/.value`; dynamic dims `batch_size`, `sequence_length`, `past_sequence_length`.
`decoder_inplace*.onnx`: new tokens over a cache that ONNX Runtime updates in place (gpt-serve's ONNX backend
prefills and decodes with it). Inputs `input_ids`, `position_ids` (batch, sequence), `cache_lengths` (batch),
`cache.{i}.key/.value` (batch, heads, columns, head size; row b's keys in columns `[0, cache_lengths[b])`, room for
the new ones after them); outputs `logits` (batch, vocab: each row's last token) and `present.{i}.key/.value`, the
cache with the new tokens' columns written: bound to the inputs' memory, nothing is copied. Each layer's attention
is one `com.microsoft` `GroupQueryAttention` node (ONNX Runtime only). Each file's metadata holds `block_size` and
the vocabulary's sha256, checked against `vocab.json` at load time."""


def _files_table(report: ExportReport) -> str:
    return "\n".join(
        f"| `{name}` | {'int8 weights, one scale per output column' if 'quantized' in name else 'fp32'} | {_mb(size)} "
        f"| `{report.sha256.get(name, '')[:16]}` |"
        for name, size in report.files.items()
    )


def _checks_passed(report: ExportReport) -> str:
    """The card's lines for the checks: which passed within which limits, never the measured figures."""
    graphs = ", ".join(w for w in report.parity if w.startswith("fp32"))
    p = next(iter(report.parity.values()), None)
    rows = ", ".join(map(str, p.batch_lengths)) if p is not None else ""
    steps = p.decode_steps if p is not None else 0
    lines = [
        f"- `onnx.checker`: {', '.join(f'{k} {c}' for k, c in report.checker.items())}.",
        f"- ONNX Runtime vs PyTorch ({graphs}): logits and caches within {report.atol:.0e} (a left-padded batch of "
        f"rows {rows}, then {steps} decode steps; the in-place graph with each row prefilled alone): passed.",
    ]
    if report.int8_inplace_vs_int8 is not None:
        lines.append(
            f"- int8 in-place vs the int8 graph, both with their weights folded to fp32: logits within "
            f"{report.atol:.0e}: passed."
        )
    v = report.val_loss
    lines.append(
        f"- int8 validation loss on {v.tokens:,} characters of {v.source}: at most {v.max_increase:+.4f} nats per "
        f"character above fp32's: passed (the figures: the export's report)."
        if v is not None
        else "- int8: not exported."
    )
    return "\n".join(lines)


def card_section(report: ExportReport, command: str) -> str:
    """The model card's ONNX section (markdown), between the markers. It records what was written (each file's size
    and sha256), how, and which checks passed within which limits; never when or how long it took, nor the measured
    differences and losses: those vary in their last digits with the CPU's kernels and the thread count (the terminal
    report prints them). So the same folder exported by the same command and versions gives the same card, byte for
    byte, on any machine, as it gives the same graphs."""
    v = report.val_loss
    versions = ", ".join(f"{k} {v}" for k, v in report.versions.items())
    eos = "the training text's rarest character" if v is not None else "the vocabulary's last character"
    shipped = report.model_dir.resolve().parent == MODELS_DIR
    name = report.model_dir.name if shipped else str(report.model_dir)
    return f"""{CARD_BEGIN}
## ONNX

Exported and validated by `{command}`
({report.exporter_version}, {report.exporter} exporter, opset {report.opset}; {versions}).

| file | weights | size | sha256 (first 16 hex digits) |
|---|---|---|---|
{_files_table(report)}

{GRAPHS_LAYOUT}

{_checks_passed(report)}

```python
from gpt_serve.generation import SamplingParams, load_backend, stream_text  # needs only numpy + onnxruntime

loaded = load_backend("{name}", "onnx-int8", threads=2)
prompt = {json.dumps(use_prompt(report.model_dir))}  # the model's first sample prompt (its corpus.json)
print("".join(stream_text(loaded.backend, loaded.vocab, prompt, 200, SamplingParams(temperature=0.8), seed=0)))
```

`onnx/genai_config.json` with `onnx/tokenizer.json` lets onnxruntime-genai run the
{"int8" if v is not None else "fp32"} graph (`og.Model("onnx")`); genai stops at `block_size` = context length (it has
no sliding window) and treats {eos} as end of text.
{CARD_END}
"""


def use_prompt(model_dir: Path) -> str:
    """The prompt of the card's snippet: the model's first sample prompt (`corpus.json`), else the empty prompt (the
    text after a newline)."""
    record = read_corpus_record(model_dir)
    return record.default_prompt if record is not None else ""


def update_model_card(model_dir: Path, section: str) -> Path:
    """Puts `section` into `model_dir/README.md`, replacing an earlier ONNX section and keeping everything else. The
    card is replaced whole (`gpt_serve.files.write_file`); a card that is a symbolic link is refused before it is read,
    so neither the link's target is changed nor its text copied into the folder."""
    path = refuse_link(Path(model_dir) / "README.md")  # before it is read: a link's target is not copied in either
    text = check_regular(path).read_text(encoding="utf-8") if path.is_file() else f"# {Path(model_dir).name}\n"
    begin, end = text.find(CARD_BEGIN), text.find(CARD_END)
    if begin != -1 and end > begin:
        text = text[:begin] + section.rstrip("\n") + text[end + len(CARD_END) :]
    else:
        text = text.rstrip("\n") + "\n\n" + section
    return write_file(path, text if text.endswith("\n") else text + "\n")
