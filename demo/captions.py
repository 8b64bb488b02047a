"""What the page says in words: the live stats line, the attention view's caption, the model line, the comparison's
column labels and status, and the note when a slider clamps a typed value. Plain functions of plain values.

Layers and heads are numbered from 0 everywhere on the page (the layer selector, the heat maps' titles, the
captions), as the model's own modules are; counts say how many.
"""

from __future__ import annotations

import json
import re

from gpt_serve.folders.corpus_record import CorpusRecord
from gpt_serve.folders.markdown import escape
from gpt_serve.generation import BACKENDS
from gpt_serve.models import LADDER
from gpt_serve.serving.registry import ModelRegistry, RequestError

from .attention import EARLIER, VIEW_POSITIONS, VISIBLE, axis_text
from .progress import GenerationRequest, Progress, plural

FAILED = "⚠️"  # how the status line starts when a run could not start or failed
PENDING_CAPTION = "⏳ The attention view of the prompt is drawn when this run ends."


def code(text: str) -> str:
    """`text` as Markdown inline code, whatever backticks it holds."""
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    return f"{fence} {text} {fence}" if len(fence) > 1 else f"`{text}`"


def numbered(n: int, noun: str) -> str:
    """'heads 0–5', 'head 0' (the only one): the 0-based numbers the page shows."""
    return f"{noun} 0" if n == 1 else f"{noun}s 0–{n - 1}"


def stats_line(p: Progress, request: GenerationRequest) -> str:
    """The live stats under the output; past block_size in exact mode, also why it slowed down."""
    ttft = "…" if p.time_to_first_token is None else f"{p.time_to_first_token * 1000:.0f} ms"
    speed = "…" if p.tokens_per_second is None else f"{p.tokens_per_second:.0f}"
    seed = f"{request.seed} (random)" if request.seed_was_random else str(request.seed)
    line = (
        f"**{p.tokens:,}** / {plural(request.max_new_tokens, 'token')} · **{speed}** tokens/s · first token "
        f"**{ttft}** · {BACKENDS[request.backend]} · model `{request.model}` · seed {seed}"
    )
    if request.window_mode == "exact" and p.past_block_size:
        line += (
            f"  \nSlower since the text passed block_size ({p.block_size}): exact mode reruns the model over the "
            f"whole window for every token; **refill** (*Past block_size*, under Sampling) restarts the cache "
            f"instead and stays fast."
        )
    return line


def attention_caption(n_layer: int, n_head: int, layer: int, chars: str) -> str:
    """What the heat maps of `layer` show: which layer and heads, the characters on their axes, how to read them."""
    layers = "the only layer" if n_layer == 1 else f"of {numbered(n_layer, 'layer')}"
    marks = [f"{VISIBLE[c]} = {name}" for c, name in (("\n", "newline"), (" ", "space"), ("\t", "tab")) if c in chars]
    axes = f"; {', '.join(marks)}" if marks else ""
    earlier = len(chars) - VIEW_POSITIONS
    shown = (
        f"; the maps show the last {VIEW_POSITIONS}, and their first column ({EARLIER}) sums each row's weight on the "
        f"{plural(earlier, 'key')} before"
        if earlier > 0
        else ""
    )
    return (
        f"Layer {layer} ({layers}) · {numbered(n_head, 'head')} · the last {plural(len(chars), 'prompt character')} "
        f"on both axes: {code(axis_text(chars))} (query ↓, key →{axes}){shown}. Row t: how query position t spreads "
        f"its attention over key positions 0..t (each row sums to 1). Colour = √weight, see the scale; shaded = "
        f"future positions, masked."
    )


def model_line(registry: ModelRegistry, model: str, backend: str) -> str:
    """One line about the selected model, and whether the selected backend can serve it."""
    try:
        info = registry.info(model)
    except RequestError as e:
        return f"{FAILED} {e}"
    reason = registry.unavailable_reason(model, backend)
    ready = f"{FAILED} {reason}" if reason else f"{BACKENDS[backend]} ✓"
    loss = "" if info["val_loss"] is None else f", validation loss {info['val_loss']:.3f}"
    record = registry.corpus(model)
    text = f" on {escape(record.name)}" if record is not None else ""
    return (
        f"`{model}`{text}: {plural(info['n_layer'], 'layer')} × {plural(info['n_head'], 'head')}, "
        f"n_embd {info['n_embd']}, block_size {info['block_size']}{loss} · {ready}"
    )


def trained_on(record: CorpusRecord | None) -> str:
    """'trained on **Tiny Shakespeare** (about 40,000 lines ...)', or that the folder records no training text; the
    record's words escaped (`gpt_serve.folders.markdown.escape`): a name is shown, never read as Markdown."""
    if record is None:
        return "whose folder records no training text (no readable corpus.json)"
    return f"trained on **{escape(record.name)}** ({escape(record.description)})"


def intro(record: CorpusRecord | None) -> str:
    """The page's heading and first lines, about the default model: what it was trained on."""
    return (
        '# gpt-serve: the "Let\'s build GPT" model, live\n'
        f"A character-level GPT {trained_on(record)}, one token per character: type a prompt, press **Generate**.\n"
        "Or run it [**in your browser**](browser/) (onnxruntime-web: your computer does the work)."
    )


def page_title(record: CorpusRecord | None) -> str:
    """The browser tab's title: 'gpt-serve: Let's build GPT on Tiny Shakespeare'."""
    return "gpt-serve: Let's build GPT" + (f" on {record.name}" if record is not None else "")


def example_prompts(record: CorpusRecord | None) -> list[list[str]]:
    """The examples under the prompt: the model's sample prompts (starts of real lines of its text)."""
    return [[prompt] for prompt in (record.prompts if record is not None else ())]


def ladder_label(name: str, registry: ModelRegistry) -> str:
    """A comparison column's label, short enough for one line: 'A · val loss 2.40' for a ladder stage (with the
    validation loss its training reached when the folder has metrics), 'shakespeare · val loss 1.48' for another
    model; `ladder_legend` says what each is."""
    label = _stage(name)
    try:
        info = registry.info(name)
    except RequestError:
        return f"{label} (not available)"
    return label if info["val_loss"] is None else f"{label} · val loss {info['val_loss']:.2f}"


def ladder_legend(names: list[str], registry: ModelRegistry) -> str:
    """What the comparison's columns are: '**A** one self-attention head · **B** ...' ('shakespeare: 4 layers × 6
    heads' for a model outside the ladder)."""
    parts = []
    for name in names:
        if name in LADDER:
            parts.append(f"**{_stage(name)}** {LADDER[name]}")
            continue
        try:
            info = registry.info(name)
            parts.append(f"**{name}** {plural(info['n_layer'], 'layer')} × {plural(info['n_head'], 'head')}")
        except RequestError:
            parts.append(f"**{name}** (not available)")
    return " · ".join(parts)


def _stage(name: str) -> str:
    """'ladder-a' -> 'A'; another model keeps its name."""
    return name.rsplit("-", 1)[-1].upper() if name in LADDER else name


COMPARE_STATES = {
    "running": "Running the prompt {prompt} (seed {seed}) through every column…",
    "done": "Done: the prompt {prompt} (seed {seed}), the same settings in every column.",
    "stopped": "Stopped: the prompt {prompt} (seed {seed}), the same settings in every column.",
}


COMPARE_FAILED = (
    "{state}: the prompt {prompt} (seed {seed}) ran in {ran} of {columns} columns, the same settings in each; "
    "{failed} could not run it (the column says why)."
)


def compare_status(prompt: str, seed: int, state: str, failed: int = 0, columns: int = 0) -> str:
    """'Done: the prompt `ROMEO:` (seed 5), the same settings in every column.' (`state`: a key of
    `COMPARE_STATES`); a newline shows as ↵, a prompt past 80 characters is cut short. With `failed` of the
    `columns` unable to run (a model missing, a character outside a vocabulary), an ended run says how many ran."""
    shown = prompt.replace("\n", "↵")
    shown = shown if len(shown) <= 80 else shown[:79] + "…"
    if failed and state != "running":
        return COMPARE_FAILED.format(
            state=state.capitalize(), prompt=code(shown), seed=seed, ran=columns - failed, columns=columns,
            failed=plural(failed, "column"),
        )  # fmt: skip
    return COMPARE_STATES[state].format(prompt=code(shown), seed=seed)


RANGE_NOTE_JS = """(value) => {
  const [label, lo, hi] = %s;
  if (typeof value !== "number" || (value >= lo && value <= hi)) return "";
  return `⚠️ ${label} goes from ${lo} to ${hi}: ${value} becomes ${Math.min(Math.max(value, lo), hi)}.`;
}"""


def range_note_js(label: str, lo: float, hi: float) -> str:
    """The browser's check of a value typed into a slider's box (its `.input` event, no server call): the slider
    clamps a value outside [lo, hi] when the box loses focus, without a word; this note says so."""
    return RANGE_NOTE_JS % json.dumps([label, lo, hi])
