"""The Gradio app: `build_demo(registry) -> gr.Blocks`. Building loads no model; the first request (or the CLI's
preload) does, once, and every later request shares it.

Events:
- `/generate` (public API, `gr.api`): a plain generator yielding the generated text so far; bad input raises
  `gr.Error` with a message naming it.
- The Generate button (UI only): the same stream, plus live stats; then the attention view of the prompt. Each
  run gets a ticket from the page; the Stop button sends the tickets back and the run's loop ends after its
  current token (`StopRequests`). A client that disconnects (or a `gradio_client` job that is cancelled) makes
  Gradio close the generator, which also ends the loop (see `demo.generation`).
- Compare the ladder (UI only): the same prompt, seed and settings through every ladder stage, side by side.

All generation events share one concurrency group of `concurrency` slots: many users stream at once instead of
waiting in line behind Gradio's default limit of 1.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from types import SimpleNamespace

import gradio as gr

from .attention import prompt_attention, render_heads
from .generation import (
    Activity,
    GenerationRequest,
    Limits,
    Progress,
    StopRequests,
    clean_prompt,
    parse_request,
    stream_progress,
    stream_side_by_side,
    throttle,
)
from .registry import BACKENDS, LADDER_MODELS, DemoInputError, ModelRegistry

logger = logging.getLogger(__name__)

DEFAULT_PROMPT = "ROMEO:"
DEFAULT_MAX_NEW_TOKENS = 300
DEFAULT_TEMPERATURE = 0.8
EXAMPLES = [
    ["ROMEO:"],
    ["JULIET:\nO Romeo, Romeo! wherefore art thou"],
    ["First Citizen:\nBefore we proceed any further, hear me speak."],
    ["KING RICHARD III:\nNow is the winter of our discontent"],
    ["To be, or not to be"],
]
WINDOW_CHOICES = [
    ("exact: the lesson's last block_size tokens (a full forward per token)", "exact"),
    ("refill: restart the cache from the last block_size/2 tokens (faster)", "refill"),
]
# A fresh ticket for each run started from the page; Stop sends the tickets back (see `StopRequests`).
NEW_TICKET_JS = "() => Math.random().toString(36).slice(2) + Date.now().toString(36)"
CSS = "#output textarea, .ladder textarea {font-family: ui-monospace, SFMono-Regular, Menlo, monospace;}"
INTRO = """# gpt-serve: the "Let's build GPT" model, live
A character-level GPT trained on Tiny Shakespeare: one token per character. Type a prompt (a speaker's name and a
colon works well), press **Generate** and watch it write; **Stop** stops the computation. Below: what its
attention heads look at in your prompt, and the lesson's ladder of models side by side."""


def format_stats(p: Progress, request: GenerationRequest) -> str:
    ttft = "…" if p.time_to_first_token is None else f"{p.time_to_first_token * 1000:.0f} ms"
    speed = "…" if p.tokens_per_second is None else f"{p.tokens_per_second:.0f}"
    seed = f"{request.seed} (random)" if request.seed_was_random else str(request.seed)
    return (
        f"**{p.tokens}** / {request.max_new_tokens} tokens · **{speed}** tokens/s · first token **{ttft}** · "
        f"{BACKENDS[request.backend]} · model `{request.model}` · seed {seed}"
    )


def attention_caption(weights, layer: int) -> str:
    n_layer, n_head, T, _ = weights.shape
    return (
        f"Layer {layer} of {n_layer} · {n_head} heads · the last {T} prompt characters. Row t: how query position t "
        f"spreads its attention over key positions 0..t (rows sum to 1; colour = √weight; grey = future positions, "
        f"masked)."
    )


def _ladder_label(name: str, registry: ModelRegistry) -> str:
    """'A: one self-attention head · val loss 2.40': what the stage adds (training presets, when importable) and
    the validation loss its training reached (when the folder has metrics)."""
    stage = name.rsplit("-", 1)[-1].upper()
    try:
        from training.presets import PRESETS

        label = f"{stage}: {PRESETS[name].adds}"
    except (ImportError, KeyError):
        label = f"{stage}: {name}"
    try:
        loss = registry.info(name)["val_loss"]
    except DemoInputError:
        return f"{label} (not available)"
    return label if loss is None else f"{label} · val loss {loss:.2f}"


def build_demo(
    registry: ModelRegistry | None = None,
    *,
    default_model: str | None = None,
    default_backend: str = "torch",
    limits: Limits | None = None,
    stream_interval: float = 0.05,
    concurrency: int = 16,
    max_queue: int | None = 256,
    activity: Activity | None = None,
) -> gr.Blocks:
    """The demo's Blocks, queue configured. Loads nothing.

    Args:
        registry: the models to serve (default: the shipped ones, `ModelRegistry.discover()`).
        default_model: the model selected when the page opens (default: the shipped default if present).
        default_backend: the backend selected when the page opens (`torch`, `onnx` or `onnx-int8`).
        limits: the largest requests accepted.
        stream_interval: the least time between two streamed updates, in seconds.
        concurrency: how many generations run at once (more wait in the queue, up to `max_queue`).
        activity: counters of running streams and generated tokens (tests and benchmarks read them).
    """
    registry = registry or ModelRegistry.discover()
    limits = limits or Limits()
    activity = activity or Activity()
    stops = StopRequests()
    model_value = registry.default_model(default_model)
    stream_group = dict(concurrency_limit=concurrency, concurrency_id="generation")

    def generate(
        prompt: str,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        temperature: float = DEFAULT_TEMPERATURE,
        top_k: int | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
        backend: str = default_backend,
        model: str = model_value,
        window_mode: str = "exact",
        unk_policy: str = "error",
    ) -> Iterator[str]:
        """Streams the continuation of `prompt` (the prompt not repeated): each result is the text so far.

        temperature 0 is greedy; top_k None/0 and top_p 1 disable those filters; seed None/-1 is random;
        backend is one of torch, onnx, onnx-int8; window_mode (past block_size) exact or refill;
        unk_policy (characters outside the vocabulary) error, replace or drop.
        """
        try:
            request = parse_request(
                registry, limits, prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                top_k=top_k, top_p=top_p, seed=seed, backend=backend, model=model, window_mode=window_mode,
                unk_policy=unk_policy,
            )
            last = None
            for p in throttle(stream_progress(registry, request, activity), stream_interval):
                if p.text != last:
                    last = p.text
                    yield p.text
        except DemoInputError as e:
            raise gr.Error(str(e), print_exception=False) from None
        except Exception as e:  # a bug or a broken model file: this request fails, the server keeps serving
            logger.exception("generation failed")
            raise gr.Error(f"generation failed: {type(e).__name__}: {e}", print_exception=False) from None

    def ui_generate(
        prompt, max_new_tokens, temperature, top_k, top_p, seed, backend, model, window_mode, replace, ticket=None,
        page: gr.Request = None,
    ):
        if page is not None:
            stops.supersede((page.session_hash, "generate"), ticket)
        try:
            request = parse_request(
                registry, limits, prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                top_k=top_k, top_p=top_p, seed=seed, backend=backend, model=model, window_mode=window_mode,
                unk_policy="replace" if replace else "error",
            )
            shown = clean_prompt(registry.vocab(request.model), request.prompt, request.unk_policy)
            yield shown, "", "Generating…"
            progress = stream_progress(registry, request, activity, should_stop=lambda: stops.is_stopped(ticket))
            for p in throttle(progress, stream_interval):
                status = "Stopped." if p.stopped else "Done." if p.done else "Generating…"
                yield shown + p.text, format_stats(p, request), status
        except DemoInputError as e:
            gr.Warning(str(e))
            yield gr.skip(), "", f"⚠️ {e}"
        except Exception as e:
            logger.exception("generation failed")
            yield gr.skip(), "", f"⚠️ generation failed: {type(e).__name__}: {e}"
        finally:
            stops.forget(ticket)

    def ui_attention(prompt, model, replace, layer):
        if not isinstance(prompt, str) or not prompt:
            return None, None, gr.skip(), ""
        try:
            name = registry.resolve_model(model)
            vocab = registry.vocab(name)
            torch_model = registry.torch_model(name)
            text = clean_prompt(vocab, prompt, "replace" if replace else "error")
            weights = prompt_attention(torch_model, vocab.encode(text))  # (L, H, T, T)
        except DemoInputError as e:
            return None, None, gr.skip(), f"No attention view: {e}"
        except ImportError as e:  # an ONNX-only install: the view needs the PyTorch model
            return None, None, gr.skip(), f"No attention view: it needs PyTorch ({e})"
        n_layer = len(weights)
        layer = layer if isinstance(layer, int) and 0 <= layer < n_layer else 0
        layers = gr.Radio(choices=[(f"layer {i}", i) for i in range(n_layer)], value=layer)
        return render_heads(weights[layer]), weights, layers, attention_caption(weights, layer)

    def ui_layer(weights, layer):
        if weights is None or not isinstance(layer, int) or not 0 <= layer < len(weights):
            return gr.skip(), gr.skip()
        return render_heads(weights[layer]), attention_caption(weights, layer)

    def ui_model_info(model, backend):
        try:
            info = registry.info(model)
        except DemoInputError as e:
            return f"⚠️ {e}"
        reason = registry.unavailable_reason(model, backend)
        ready = f"⚠️ {reason}" if reason else f"{BACKENDS[backend]} ✓"
        loss = "" if info["val_loss"] is None else f", validation loss {info['val_loss']:.3f}"
        return (
            f"`{model}`: {info['n_layer']} layers × {info['n_head']} heads, n_embd {info['n_embd']}, "
            f"block_size {info['block_size']}{loss} · {ready}"
        )

    ladder = [n for n in LADDER_MODELS if n in registry.names]

    def ui_compare(
        prompt, max_new_tokens, temperature, top_k, top_p, seed, backend, window_mode, replace, ticket=None,
        page: gr.Request = None,
    ):
        if page is not None:
            stops.supersede((page.session_hash, "compare"), ticket)
        try:
            base = parse_request(
                registry, limits, prompt=prompt, max_new_tokens=max_new_tokens, temperature=temperature,
                top_k=top_k, top_p=top_p, seed=seed, backend=backend, model=model_value, window_mode=window_mode,
                unk_policy="replace" if replace else "error",
            )
            streams = [
                registry.unavailable_reason(name, base.backend)
                or stream_progress(
                    registry, dataclasses.replace(base, model=name), activity,
                    should_stop=lambda: stops.is_stopped(ticket),
                )
                for name in ladder
            ]
            settings = f"same prompt, seed {base.seed} and settings through every stage"
            for texts in stream_side_by_side(streams, stream_interval):
                yield *texts, f"Running: {settings}…"
            yield *[gr.skip()] * len(ladder), "Stopped." if stops.is_stopped(ticket) else f"Done: {settings}."
        except DemoInputError as e:
            yield *[gr.skip()] * len(ladder), f"⚠️ {e}"
        finally:
            stops.forget(ticket)

    def ui_stop(generate_ticket, compare_ticket, page: gr.Request = None):
        stops.stop(generate_ticket, compare_ticket)  # runs still waiting in the queue
        if page is not None:
            stops.stop_page(page.session_hash)  # and the page's running ones, whichever ticket it holds now

    with gr.Blocks(title="gpt-serve: Let's build GPT", analytics_enabled=False) as demo:
        gr.Markdown(INTRO)
        with gr.Row():
            with gr.Column(scale=2):
                prompt = gr.Textbox(DEFAULT_PROMPT, label="Prompt", lines=4, elem_id="prompt")
                with gr.Row():
                    generate_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                    stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                gr.Examples(EXAMPLES, inputs=[prompt], label="Examples")
                with gr.Accordion("Sampling", open=True):
                    max_new_tokens = gr.Slider(
                        1, limits.max_new_tokens, DEFAULT_MAX_NEW_TOKENS, step=1, label="Max new tokens",
                        elem_id="max-new-tokens",
                    )
                    temperature = gr.Slider(0, 2, DEFAULT_TEMPERATURE, step=0.05, label="Temperature (0 = greedy)")
                    top_k = gr.Slider(0, 100, 0, step=1, label="Top-k (0 = off)")
                    top_p = gr.Slider(0.01, 1, 1.0, step=0.01, label="Top-p (1 = off)")
                    seed = gr.Number(-1, precision=0, label="Seed (-1 = random)", elem_id="seed")
                    window_mode = gr.Radio(WINDOW_CHOICES, value="exact", label="Past block_size")
                    replace = gr.Checkbox(False, label="Replace unknown characters with a space")
            with gr.Column(scale=3):
                with gr.Row():
                    model = gr.Dropdown(
                        [(n if n in registry.available else f"{n} (not available)", n) for n in registry.names],
                        value=model_value, label="Model", elem_id="model",
                    )
                    backend = gr.Dropdown(
                        [(label, key) for key, label in BACKENDS.items()], value=default_backend, label="Backend",
                        elem_id="backend",
                    )
                model_info = gr.Markdown(elem_id="model-info")
                output = gr.Textbox(
                    label="Output", lines=16, max_lines=28, interactive=False, autoscroll=True, elem_id="output",
                    buttons=["copy"],
                )
                stats = gr.Markdown(elem_id="stats")
                status = gr.Markdown(elem_id="status")
        with gr.Accordion("Attention: what each head looks at in the prompt", open=True):
            layer = gr.Radio([("layer 0", 0)], value=0, label="Layer", elem_id="layer")
            heatmap = gr.Image(
                label="Attention heat maps (query position ↓ × key position →)", show_label=False, type="numpy",
                format="png", interactive=False, elem_id="attention", buttons=["download", "fullscreen"],
            )
            caption = gr.Markdown(elem_id="attention-caption")
            attention_state = gr.State(None)
        gen_ticket = gr.Textbox(visible="hidden", elem_id="gen-ticket")
        compare_ticket = gr.Textbox(visible="hidden", elem_id="compare-ticket")
        with gr.Accordion("Compare the ladder: what each lesson component buys", open=False):
            gr.Markdown(
                "Runs the prompt, seed and sampling settings above through every stage of the lesson's ladder "
                "(A–E), side by side. Set a seed to make it repeatable."
            )
            compare_btn = gr.Button("Compare the ladder", elem_id="compare-btn")
            with gr.Row():
                ladder_outputs = [
                    gr.Textbox(label=_ladder_label(n, registry), lines=12, interactive=False, elem_classes="ladder",
                               elem_id=f"compare-{n}")
                    for n in ladder
                ]
            compare_status = gr.Markdown()

        sampling = [max_new_tokens, temperature, top_k, top_p, seed]
        private = dict(api_visibility="private")
        gen_event = generate_btn.click(None, None, gen_ticket, js=NEW_TICKET_JS, queue=False, **private).then(
            ui_generate, [prompt, *sampling, backend, model, window_mode, replace, gen_ticket], [output, stats, status],
            **private, **stream_group,
        )
        gen_event.then(  # also after Stop: the view is of the prompt
            ui_attention, [prompt, model, replace, layer], [heatmap, attention_state, layer, caption], **private,
            concurrency_limit=concurrency, concurrency_id="attention",
        )
        layer.input(ui_layer, [attention_state, layer], [heatmap, caption], queue=False, **private)
        compare_btn.click(None, None, compare_ticket, js=NEW_TICKET_JS, queue=False, **private).then(
            ui_compare, [prompt, *sampling, backend, window_mode, replace, compare_ticket],
            [*ladder_outputs, compare_status], **private, **stream_group,
        )
        stop_btn.click(ui_stop, [gen_ticket, compare_ticket], None, queue=False, **private)
        for trigger in (model.change, backend.change, demo.load):
            trigger(ui_model_info, [model, backend], model_info, queue=False, **private)
        gr.api(generate, api_name="generate", **stream_group)
    demo.queue(default_concurrency_limit=concurrency, max_size=max_queue)
    # for tests and benchmarks: the counters, the models, and the event functions callable without a browser
    demo.activity, demo.registry, demo.stops = activity, registry, stops
    demo.handlers = SimpleNamespace(
        generate=generate, ui_generate=ui_generate, ui_attention=ui_attention, ui_layer=ui_layer,
        ui_model_info=ui_model_info, ui_compare=ui_compare, ui_stop=ui_stop,
    )
    return demo
