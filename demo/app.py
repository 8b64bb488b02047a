"""The Gradio page: `build_demo(registry) -> gr.Blocks`, the layout and the wiring of `demo.handlers`.

Building loads no model; the first request (or the CLI's preload) does, once, and every later request shares it.

Events:
- `/generate` (public API, `gr.api`): a plain generator yielding the generated text so far; bad input raises
  `gr.Error` with a message naming it.
- The Generate button (UI only): the same stream, plus live stats; the previous attention view is cleared at
  once, and the view of the prompt is drawn when the run ends. Each run gets a ticket from the page; the Stop
  button (enabled only while a run is on) sends the tickets back and the run's loop ends after its current token
  (`StopRequests`). A client that disconnects (or a `gradio_client` job that is cancelled) makes Gradio close the
  generator, which also ends the loop (see `demo.progress`).
- The comparison (UI only): the same prompt, seed and settings through several models side by side
  (`demo.comparison`): the default model's earlier checkpoints when its training kept some (`--snapshots`), else
  the ladder stages that share its vocabulary (no comparison on the page when there is neither).
- The page presents the default model: its title, intro, default prompt and examples come from the model folder's
  `corpus.json` (what it was trained on); choosing another model shows that one's examples.
- A value typed into a slider's box outside its range: a note under the sliders (in the browser; the slider
  clamps it).
- Errors are said once, in the status line: no toasts.

All generation events share one concurrency group of `concurrency` slots: many users stream at once instead of
waiting in line behind Gradio's default limit of 1.
"""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace

import gradio as gr
from starlette.middleware import Middleware

from gpt_serve.generation import BACKENDS
from gpt_serve.generation.fields import DEFAULT_BACKEND, MAX_NEW_TOKENS
from gpt_serve.generation.scheduler import DEFAULT_MAX_BATCH, DEFAULT_MAX_QUEUE
from gpt_serve.serving.http_guards import BodyLimits, body_limits
from gpt_serve.serving.registry import ModelRegistry
from gpt_serve.serving.server_limits import ServerLimits

from .access import access_options
from .attention import VIEW_CSS, VIEW_JS
from .captions import PENDING_CAPTION, example_prompts, intro, page_title, range_note_js
from .comparison import Comparison
from .curve import curve_update
from .form import FORM
from .format_control import format_control
from .handlers import PAGE_FIELDS, SAMPLING_SLIDERS, DemoHandlers
from .input_checks import describe_parameters, explain_bad_inputs
from .progress import Activity

# A fresh ticket for each run started from the page; its Stop sends the ticket back (see `StopRequests`). A run also
# enables its Stop (`DemoHandlers.ui_generate_ended` / `ui_compare_ended` disable it again) and clears what the page
# shows of an earlier run: the output, its stats and status, and the attention view (drawn again when it ends).
NEW_TICKET = "Math.random().toString(36).slice(2) + Date.now().toString(36)"
ENABLED = '{__type__: "update", interactive: true}'  # what gr.Button(interactive=True) sends to the page
VIEW_CLEARED = f'"", {json.dumps(PENDING_CAPTION)}'  # the attention view and its caption
CLEARED = f'"", "", "", {VIEW_CLEARED}'  # Generate's output, stats and status, and the attention view
START_GENERATE_JS = f"() => [{NEW_TICKET}, {ENABLED}, {CLEARED}]"
START_COMPARE_JS = f"() => [{NEW_TICKET}, {ENABLED}, {VIEW_CLEARED}]"  # Generate's output stays
# Each Stop sends its own run's ticket only (`DemoHandlers.ui_stop` takes Generate's, then the comparison's)
STOP_GENERATE_JS = '(generate, compare) => [generate, ""]'
# After a run (ended or stopped) the output box shows its latest text: Gradio's last update of a stream leaves the box
# scrolled to its top.
SCROLL_OUTPUT_JS = """() => requestAnimationFrame(() => {
  const box = document.querySelector("#output textarea");
  if (box) box.scrollTop = box.scrollHeight;
})"""
STOP_COMPARE_JS = '(generate, compare) => ["", compare]'


# What the server accepts and keeps for clients, bounded (every client can reach every event): request bodies as on
# `gpt-serve serve` (`gpt_serve.serving.http_guards`: 1 MiB, whole within 30 s, by default); no file input exists, so an
# upload is refused past a few kB; Gradio keeps about 1 MB per page session (a copy of the page's config), so at most
# 64 sessions are kept, the oldest evicted first (an evicted page keeps working; its attention view's layer selector
# forgets the last prompt).
# With an API key, the key guards the page, its Gradio API and the OpenAI-compatible API (`demo.access`).
def launch_options(
    limits: ServerLimits | None = None, api_key: str | None = None, metrics_need_key: bool = False, allow_origins=()
) -> dict:
    """`Blocks.launch` arguments: the page's CSS and script, the limits above, and with `api_key` the login and the
    key check (a fresh dict each time: Gradio adds to its `app_kwargs`)."""
    limits = limits or ServerLimits()
    access = access_options(api_key, metrics_need_key, allow_origins, limits.body_timeout)
    body = Middleware(BodyLimits, **body_limits(limits))
    middleware = [*access["middleware"], body]  # the key is checked first: no body is read before it
    return dict(
        css=CSS,
        js=ON_LOAD_JS,
        max_file_size="16kb",
        state_session_capacity=64,
        auth=access["auth"],
        app_kwargs={"middleware": middleware, **access["app_kwargs"]},
    )


# A disabled Stop looks like any disabled button (Gradio draws it in its "stop" colour, as if it could be pressed);
# a comparison column's label stays on one line, so that every column's box starts at the same height; on a narrow
# screen the title is smaller, the examples are one row that scrolls sideways, and the settings column is tighter
# (its folded accordions: the training curve and the sampling).
CSS = """
#output textarea, .ladder textarea {font-family: ui-monospace, SFMono-Regular, Menlo, monospace;}
#attention-caption code, #compare-status code {white-space: pre-wrap; word-break: break-all;}
.stop-btn:disabled, .stop-btn[disabled] {background: var(--button-secondary-background-fill);
  color: var(--body-text-color-subdued); border-color: var(--border-color-primary); opacity: 0.6;
  cursor: not-allowed; box-shadow: none;}
.ladder [data-testid="block-info"] {white-space: nowrap; overflow: hidden; text-overflow: ellipsis; display: block;}
#intro h1 {margin-bottom: 0.2em;}
@media (max-width: 720px) {
  #intro h1 {font-size: 1.5rem;}
  #settings-column {gap: 8px;}
  #curve, #sampling {padding-top: 6px; padding-bottom: 6px;}
  #examples .gallery:has(> .gallery-item) {flex-wrap: nowrap; overflow-x: auto; padding-bottom: 4px;}
  #examples .gallery-item {flex: 0 0 auto;}
  #examples .gallery-item .gallery {white-space: nowrap !important;}
}
"""
# On a narrow screen (a phone) the settings and the training curve start folded: the prompt, the output and the
# attention view come first.
ON_LOAD_JS = """() => {
  if (window.matchMedia("(max-width: 720px)").matches) {
    for (const id of ["sampling", "curve"]) {
      document.querySelector(`#${id} > .label-wrap.open, #${id} > button.open`)?.click();
    }
  }
}"""


def build_demo(
    registry: ModelRegistry | None = None,
    *,
    default_model: str | None = None,
    default_backend: str = DEFAULT_BACKEND,
    max_tokens_limit: int = MAX_NEW_TOKENS,
    stream_interval: float = 0.05,
    max_updates_per_second: float | None = 200.0,
    concurrency: int = DEFAULT_MAX_BATCH,
    max_queue: int | None = DEFAULT_MAX_QUEUE,
    activity: Activity | None = None,
) -> gr.Blocks:
    """The demo's Blocks, queue configured. Loads nothing.

    Args:
        registry: the models to serve (default: the shipped ones, `ModelRegistry.discover()`).
        default_model: the model selected when the page opens, and /generate's default (default: the shipped
            default if present, else the first model found).
        default_backend: the backend selected when the page opens, and /generate's default (`torch`, `onnx` or
            `onnx-int8`).
        max_tokens_limit: the most new tokens a request may ask for (`--max-tokens-limit`).
        stream_interval: the least time between two streamed updates of one stream, in seconds.
        max_updates_per_second: about how many streamed updates all streams together send at most (many streams
            at once are each updated less often); None for no limit.
        concurrency: how many generations run at once (more wait in the queue, up to `max_queue`).
        activity: counters of running streams and generated tokens (tests and benchmarks read them).
    """
    registry = registry or ModelRegistry.discover()
    handlers = DemoHandlers(
        registry,
        max_tokens_limit,
        activity or Activity(),
        stream_interval,
        registry.default_model(default_model),
        default_backend,
        max_updates_per_second,
    )
    record = registry.corpus(handlers.default_model)  # the page presents the default model: what it was trained on
    with gr.Blocks(title=page_title(record), analytics_enabled=False) as demo:
        gr.Markdown(intro(record), elem_id="intro")
        ui = _layout(registry, handlers, max_tokens_limit, default_backend)
        _wire(demo, ui, handlers, concurrency)
    demo.queue(default_concurrency_limit=concurrency, max_size=max_queue)
    explain_bad_inputs(demo)  # every event, private ones included: a message, not {"error": null}
    # for tests and benchmarks: the counters, the models, and the event functions callable without a browser
    demo.activity, demo.registry, demo.handlers = handlers.activity, registry, handlers
    return demo


def _layout(
    registry: ModelRegistry, handlers: DemoHandlers, max_tokens_limit: int, default_backend: str
) -> SimpleNamespace:
    """The page's components; `form` holds the request's, in the order of `PAGE_FIELDS`. The prompt, the buttons and
    the output come first, the settings beside them (below them on a narrow screen, where the columns wrap)."""
    ui = SimpleNamespace()
    record = registry.corpus(handlers.default_model)
    with gr.Row():
        with gr.Column(scale=3, min_width=320):
            _run_layout(ui, record)
        with gr.Column(scale=2, min_width=320, elem_id="settings-column"):
            _model_layout(ui, registry, handlers, record, default_backend)
            with gr.Accordion("Sampling", open=True, elem_id="sampling"):
                _sampling_layout(ui, max_tokens_limit, handlers.ui_model_sampling(handlers.default_model))
    _attention_layout(ui, registry)
    ui.gen_ticket = gr.Textbox(visible="hidden", elem_id="gen-ticket")
    ui.compare_ticket = gr.Textbox(visible="hidden", elem_id="compare-ticket")
    ui.compare_btn = None
    if handlers.comparison is not None:
        _compare_layout(ui, handlers.comparison)
    ui.form = [getattr(ui, name) for name in PAGE_FIELDS]
    return ui


def _run_layout(ui: SimpleNamespace, record) -> None:
    """The prompt, Generate and Stop, the output, its stats and status."""
    default_prompt = record.default_prompt if record is not None else FORM["prompt"]["default"]
    ui.prompt = gr.Textbox(default_prompt, label=FORM["prompt"]["label"], lines=4, elem_id="prompt")
    with gr.Row():
        ui.generate_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn", min_width=100)
        ui.stop_btn = gr.Button("Stop", variant="stop", interactive=False, elem_id="stop-btn",
                                elem_classes="stop-btn", min_width=100)  # fmt: skip
    ui.output = gr.Textbox(  # a few lines until text comes, then it grows
        label="Output",
        lines=4,
        max_lines=28,
        interactive=False,
        autoscroll=True,
        elem_id="output",
        buttons=["copy"],
    )
    ui.stats = gr.Markdown(elem_id="stats")
    ui.status = gr.Markdown(elem_id="status")


def _model_layout(ui: SimpleNamespace, registry: ModelRegistry, handlers: DemoHandlers, record, backend: str) -> None:
    """The examples, the model and backend, a line about the model, and its training curve (`demo.curve`)."""
    examples = example_prompts(record)  # the model's sample prompts; updated when another model is chosen
    ui.examples = gr.Examples(examples or [[""]], inputs=[ui.prompt], label="Examples", elem_id="examples").dataset
    ui.examples.visible = bool(examples)
    with gr.Row():
        ui.model = gr.Dropdown(
            [(n if n in registry.available else f"{n} (not available)", n) for n in registry.names],
            value=handlers.default_model,
            label="Model",
            elem_id="model",
        )
        ui.backend = gr.Dropdown(
            [(label, key) for key, label in BACKENDS.items()], value=backend, label="Backend", elem_id="backend"
        )
    ui.model_info = gr.Markdown(elem_id="model-info")
    with gr.Accordion("Training curve", open=True, elem_id="curve"):  # folded on a phone (ON_LOAD_JS)
        ui.curve = gr.Plot(show_label=False, elem_id="curve-plot", visible=False)
        ui.curve_note = gr.Markdown(elem_id="curve-note")


def _sampling_layout(ui: SimpleNamespace, max_tokens_limit: int, start: tuple) -> None:
    """The Format control and the sampling settings; the sliders (`SAMPLING_SLIDERS`) start at `start`, the default
    model's defaults, so the page's opening changes none of them (a value typed at once is kept)."""
    format_control(ui)  # a regex or choices the text must fit (demo.format_control); folded on a phone
    start = dict(zip(SAMPLING_SLIDERS, start, strict=True))
    # the sliders' ranges: the server's limit of new tokens, and what is worth sliding through
    ui.max_new_tokens = _field(gr.Slider, "max_new_tokens", 1, max_tokens_limit, step=1, value=start)
    ui.temperature = _field(gr.Slider, "temperature", 0, 2, step=0.05, value=start)
    ui.top_k = _field(gr.Slider, "top_k", 0, 100, step=1, value=start)
    ui.top_p = _field(gr.Slider, "top_p", 0.01, 1, step=0.01, value=start)
    ui.settings_note = gr.Markdown(elem_id="settings-note")  # a typed value the slider clamped
    ui.seed = _field(gr.Number, "seed", precision=0)
    ui.window_mode = _field(gr.Radio, "window_mode")
    ui.unk_policy = _field(gr.Radio, "unk_policy")


def _attention_layout(ui: SimpleNamespace, registry: ModelRegistry) -> None:
    """The attention view: a layer selector, the heat maps, their caption."""
    with gr.Accordion("Attention: what each head looks at in the prompt", open=True):
        # Every layer any model has: a page whose session the server evicted (`launch_options`) falls back to these
        # choices, and its clicks must still pass Gradio's check; `ui_attention` narrows them to the model's.
        layers = [(f"layer {i}", i) for i in range(_most_layers(registry))]
        ui.layer = gr.Radio(layers, value=0, label="Layer (numbered from 0)", elem_id="layer")
        ui.heatmap = gr.HTML(  # empty (nothing drawn, no placeholder) until a run ends; see demo.attention
            label="Attention heat maps (query position ↓ × key position →)",
            css_template=VIEW_CSS,
            js_on_load=VIEW_JS,
            elem_id="attention",
        )
        ui.caption = gr.Markdown(elem_id="attention-caption")
        ui.attention_state = gr.State(None, time_to_live=3600)  # (model, ids): see DemoHandlers.ui_attention


def _compare_layout(ui: SimpleNamespace, comparison: Comparison) -> None:
    """The comparison: the ladder's stages, or the default model's earlier checkpoints (`demo.comparison`)."""
    with gr.Accordion(comparison.title, open=False, elem_id="compare"):
        gr.Markdown(comparison.intro, elem_id="compare-intro")
        with gr.Row():
            ui.compare_btn = gr.Button(comparison.button, elem_id="compare-btn", scale=3, min_width=100)
            ui.compare_stop_btn = gr.Button(
                "Stop", variant="stop", interactive=False, elem_id="compare-stop-btn", elem_classes="stop-btn",
                scale=1, min_width=100,
            )  # fmt: skip
        ui.compare_status = gr.Markdown(elem_id="compare-status")
        with gr.Row():
            ui.compare_outputs = [
                gr.Textbox(
                    label=column.label,
                    lines=12,
                    interactive=False,
                    elem_classes="ladder",
                    min_width=150,
                    elem_id=column.elem_id,
                )
                for column in comparison.columns
            ]


def _field(component, name: str, *args, value: dict | None = None, **kwargs):
    """The component of the form's field `name`, with its label, default (`value[name]` where given) and choices
    (`demo.form.FORM`), and the element id the tests find it by (max_new_tokens: `max-new-tokens`)."""
    field = FORM[name]
    if "choices" in field:
        kwargs["choices"] = field["choices"]
    start = (value or {}).get(name, field["default"])
    return component(*args, value=start, label=field["label"], elem_id=name.replace("_", "-"), **kwargs)


PRIVATE = dict(api_visibility="private")  # the page's own events: not on the API page


def _wire(demo: gr.Blocks, ui: SimpleNamespace, handlers: DemoHandlers, concurrency: int) -> None:
    """The events: the page's runs (private) and the public /generate API, in one concurrency group.

    Progress is drawn only where it belongs (`show_progress_on`): Gradio puts an event's timer ("0.2s") into each
    of its outputs otherwise, even with `show_progress="hidden"` (it is then transparent, but part of the text)."""
    stream_group = dict(concurrency_limit=concurrency, concurrency_id="generation")
    attention = dict(
        fn=handlers.ui_attention,
        outputs=[ui.heatmap, ui.attention_state, ui.layer, ui.caption],
        concurrency_limit=concurrency,
        concurrency_id="attention",
        show_progress="minimal",
        show_progress_on=ui.heatmap,
        **PRIVATE,
    )
    _wire_generate(ui, handlers, stream_group, attention)
    ui.layer.input(  # queued with the attention view: it runs the model on the decode loop's thread
        handlers.ui_layer,
        [ui.attention_state, ui.layer],
        [ui.heatmap, ui.caption],
        concurrency_limit=concurrency,
        concurrency_id="attention",
        show_progress="minimal",
        show_progress_on=ui.heatmap,
        **PRIVATE,
    )
    if ui.compare_btn is not None:
        _wire_compare(ui, handlers, stream_group, attention)
    for slider in (ui.max_new_tokens, ui.temperature, ui.top_k, ui.top_p):
        note = range_note_js(slider.label, slider.minimum, slider.maximum)
        slider.input(None, slider, ui.settings_note, js=note, queue=False, trigger_mode="always_last", **PRIVATE)
    _wire_model_choice(demo, ui, handlers)
    api = gr.api(handlers.api_generate(), api_name="generate", **stream_group)
    describe_parameters(demo.fns[api["id"]])


def _wire_generate(ui: SimpleNamespace, handlers: DemoHandlers, stream_group: dict, attention: dict) -> None:
    """Generate and its Stop. A run starts in the browser (no server call): a new ticket, Stop enabled, and the
    attention view of the previous prompt cleared. Streams show no progress overlay: the status line and the live
    stats say a run is on, and drawing the overlay delays the first characters by ~150 ms on a busy 2-core
    machine."""
    cleared = [ui.output, ui.stats, ui.status, ui.heatmap, ui.caption]
    gen_event = ui.generate_btn.click(
        None, None, [ui.gen_ticket, ui.stop_btn, *cleared], js=START_GENERATE_JS, queue=False, **PRIVATE
    ).then(
        handlers.ui_generate,
        [ui.gen_ticket, *ui.form],
        [ui.output, ui.stats, ui.status],
        show_progress="hidden",
        show_progress_on=ui.output,
        **PRIVATE,
        **stream_group,
    )
    gen_event.then(handlers.ui_generate_ended, None, ui.stop_btn, queue=False, show_progress="hidden", **PRIVATE)
    gen_event.then(None, None, None, js=SCROLL_OUTPUT_JS, queue=False, **PRIVATE)
    # also after Stop: the view is of the prompt
    gen_event.then(inputs=[ui.prompt, ui.model, ui.unk_policy, ui.layer, ui.status], **attention)
    ui.stop_btn.click(handlers.ui_stop, [ui.gen_ticket, ui.compare_ticket], None, js=STOP_GENERATE_JS, queue=False,
                      **PRIVATE)  # fmt: skip


def _wire_model_choice(demo: gr.Blocks, ui: SimpleNamespace, handlers: DemoHandlers) -> None:
    """What follows the model chosen (and the page's opening): its line, its sampling defaults, its examples, its
    training curve."""
    quiet = dict(queue=False, show_progress="hidden", **PRIVATE)
    for trigger in (ui.model.change, ui.backend.change, demo.load):
        trigger(handlers.ui_model_info, [ui.model, ui.backend], ui.model_info, show_progress_on=ui.model, **quiet)
    sliders = [getattr(ui, name) for name in SAMPLING_SLIDERS]
    curve = functools.partial(curve_update, handlers.registry)
    # the sampling of the model chosen (its generation_config.json; the page opens with the default model's), and its
    # training curve
    ui.model.change(handlers.ui_model_sampling, [ui.model], sliders, **quiet)
    for trigger in (ui.model.change, demo.load):
        trigger(curve, [ui.model], [ui.curve, ui.curve_note], show_progress_on=ui.curve_note, **quiet)
    # the examples (and an untouched default prompt) of the model chosen
    ui.model.change(handlers.ui_model_prompts, [ui.model, ui.prompt], [ui.examples, ui.prompt], **quiet)


def _wire_compare(ui: SimpleNamespace, handlers: DemoHandlers, stream_group: dict, attention: dict) -> None:
    """The comparison's events (when the page has one): its run, its Stop, the attention view after it. It
    clears the attention view (drawn again when it ends), not Generate's output."""
    private = PRIVATE
    compare_event = ui.compare_btn.click(
        None, None, [ui.compare_ticket, ui.compare_stop_btn, ui.heatmap, ui.caption], js=START_COMPARE_JS,
        queue=False, **private,
    ).then(
        handlers.ui_compare,
        [ui.compare_ticket, *ui.form],
        [*ui.compare_outputs, ui.compare_status],
        show_progress="hidden",
        show_progress_on=ui.compare_outputs,
        **private,
        **stream_group,
    )  # fmt: skip
    compare_event.then(
        handlers.ui_compare_ended, None, ui.compare_stop_btn, queue=False, show_progress="hidden", **private
    )
    compare_event.then(inputs=[ui.prompt, ui.model, ui.unk_policy, ui.layer, ui.compare_status], **attention)
    ui.compare_stop_btn.click(
        handlers.ui_stop, [ui.gen_ticket, ui.compare_ticket], None, js=STOP_COMPARE_JS, queue=False, **private
    )


def _most_layers(registry: ModelRegistry) -> int:
    """The most layers of any available model (1 when none can be read)."""
    counts = []
    for name in registry.available:
        try:
            counts.append(int(registry.info(name)["n_layer"]))
        except (ValueError, TypeError, KeyError):  # a broken config: its own view says so
            pass
    return max(counts, default=1)
