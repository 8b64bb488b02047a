"""The functions behind the demo's events and its /generate API, as methods of one object; no layout.

`DemoHandlers` holds what every request shares (the models, the cap on max_new_tokens, the counters, the stop
requests); the page (`demo.app.build_demo`) wires its methods to buttons, and tests call them directly, without a
browser.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import typing
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Literal

import gradio as gr

from gpt_serve.chargpt.vocab import UNK_POLICIES
from gpt_serve.chargpt.window import DEFAULT_WINDOW_MODE
from gpt_serve.generation import BACKENDS, WINDOW_MODES
from gpt_serve.generation.fields import MAX_PROMPT_CHARS
from gpt_serve.serving.registry import ModelRegistry, RequestError

from .attention import prompt_attention, render_heads
from .captions import FAILED, attention_caption, compare_status, example_prompts, model_line, stats_line
from .comparison import Column, comparison_for
from .form import FORM
from .format_control import in_page_words, page_message, structured_outputs
from .progress import (
    Activity,
    GenerationRequest,
    StopRequests,
    encode_prompt,
    parse_form,
    stream_progress,
    stream_side_by_side,
    throttle,
)

logger = logging.getLogger(__name__)

SAMPLING_SLIDERS = ("max_new_tokens", "temperature", "top_k", "top_p")  # set to a model's defaults when it is chosen
PAGE_UNK_HINT = FORM["unk_policy"]["hint"]  # how the page accepts characters outside the vocabulary (`demo.form`)
ATTENTION_CACHE = 8  # attention views kept for the layer selector (each at most n_layer x n_head x T x T floats)


def sends_updates(method):
    """A generator method whose run streams updates to one client: counted while it runs (`interval` divides the
    update budget by the runs, not by their streams: a ladder comparison is one run of six streams)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._lock:
            self._updating += 1
        try:
            yield from method(self, *args, **kwargs)
        finally:
            with self._lock:
                self._updating -= 1

    return run


class DemoHandlers:
    """The demo's event functions.

    Args:
        registry: the models to serve.
        max_tokens_limit: the most new tokens a request may ask for (`--max-tokens-limit`).
        activity: counters of running streams and generated tokens (tests and benchmarks read them).
        stream_interval: the least time between two streamed updates of one stream, in seconds.
        default_model: what /generate uses when `model` is not given.
        default_backend: what /generate uses when `backend` is not given.
        max_updates_per_second: how many streamed updates all streams together send at most, about: with many
            streams at once, each one's updates are spaced further apart (`interval`). None for no such limit.
    """

    def __init__(
        self,
        registry: ModelRegistry,
        max_tokens_limit: int,
        activity: Activity,
        stream_interval: float,
        default_model: str,
        default_backend: str,
        max_updates_per_second: float | None = 200.0,
    ):
        self.registry, self.max_tokens_limit, self.activity = registry, max_tokens_limit, activity
        self.stream_interval, self.max_updates_per_second = stream_interval, max_updates_per_second
        self.default_model, self.default_backend = default_model, default_backend
        self.stops = StopRequests()
        self._weights: OrderedDict[tuple, object] = OrderedDict()  # (model, ids) -> attention weights, a few
        self._weights_lock = threading.Lock()
        self._lock, self._updating = threading.Lock(), 0  # runs streaming updates now (`sends_updates`)
        # the comparison's columns (the ladder, or the model's earlier checkpoints); None: the page has none
        self.comparison = comparison_for(registry, default_model)
        self.columns = self.comparison.columns if self.comparison else (Column(default_model, registry, "", ""),)

    @property
    def compared(self) -> list[str]:
        """The names of the comparison's columns (the default model alone: the page has no comparison)."""
        return [c.name for c in self.columns]

    def close(self) -> None:
        """Stops the decode loops the handlers started of their own (the snapshots'); the server's registry is its
        owner's to close."""
        if self.comparison is not None:
            self.comparison.close()

    def interval(self) -> float:
        """The least seconds between two updates of one stream now: `stream_interval`, or longer while so many
        runs stream at once that together they would send more than `max_updates_per_second`. Every update costs
        the server and its client work of their own (Gradio's message, the client's parsing) whatever it carries;
        a crowd of streams each updated per token would spend the CPU on that instead of on decoding. A stream's
        first token and its end are sent at once whatever the interval (`throttle`)."""
        if not self.max_updates_per_second:
            return self.stream_interval
        return max(self.stream_interval, self._updating / self.max_updates_per_second)

    def _parse(self, form: dict) -> GenerationRequest:
        """Checks the request fields (`FIELDS`, by name); None for backend and model means the defaults."""
        form = {**form}
        form["backend"] = self.default_backend if form["backend"] is None else form["backend"]
        form["model"] = self.default_model if form["model"] is None else form["model"]
        return parse_form(self.registry, self.max_tokens_limit, form)

    def _parse_page(self, form) -> GenerationRequest:
        """Checks the page's form (`PAGE_FIELDS`, in order): its Format control becomes `structured_outputs`."""
        form = dict(zip(PAGE_FIELDS, form, strict=True))
        form["structured_outputs"] = structured_outputs(form.pop("format"), form.pop("format_text"))
        return self._parse(form)

    @sends_updates
    def generate(
        self,
        prompt: str,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        backend: str | None = None,
        model: str | None = None,
        window_mode: str = DEFAULT_WINDOW_MODE,
        unk_policy: str = "error",
        structured_outputs: dict | None = None,
    ) -> Iterator[str]:
        """Streams the continuation of a prompt, without the prompt: each result is the whole text so far.

        Args:
            prompt: the text to continue, in the model's characters (see unk_policy for the others).
            max_new_tokens: how many characters to generate (1 to the server's limit); None for the model's default
                (its folder's generation_config.json), as for the three below.
            temperature: sampling temperature; 0 is greedy (always the most likely character).
            top_k: sample among the k most likely characters only; 0 for all of them.
            top_p: sample among the most likely characters that together reach this probability; 1 for all.
            seed: the random seed (the same seed and settings give the same text); None or -1 for a random one.
            backend: what runs the model: torch (PyTorch), onnx (ONNX Runtime fp32) or onnx-int8; None for the default.
            model: which model to run (a shipped model's name); None for the server's default.
            window_mode: past block_size, exact (the lesson's sliding window) or refill (faster, restarts the cache).
            unk_policy: characters outside the vocabulary: error (refuse, naming them), replace (by a space) or drop.
            structured_outputs: what the text must be: {"regex": R}, {"choice": [A, B]}, {"json": schema}; None: any.

        Returns:
            the generated text so far (streamed: each update replaces the previous one).
        """
        sent = locals()
        try:
            request = self._parse({name: sent[name] for name in FIELDS})
            last = None
            progress = stream_progress(self.registry, request, self.activity, poll_interval=self.interval)
            for p in throttle(progress, self.interval):
                if p.text != last and (p.tokens or p.done):
                    last = p.text
                    yield p.text
        except RequestError as e:
            raise gr.Error(str(e), print_exception=False) from None
        except Exception as e:  # a bug or a broken model file: this request fails, the server keeps serving
            logger.exception("generation failed")
            raise gr.Error(f"generation failed: {type(e).__name__}: {e}", print_exception=False) from None

    def api_generate(self) -> Callable[..., Iterator[str]]:
        """`generate` as the /generate API: the same function with its types spelled out for Gradio's API page and
        clients (`Literal` choices of backend, model, window and unknown-character policy; a `str` output) and the
        server's defaults in place of None."""

        def generate(*args, **kwargs) -> Iterator[str]:
            yield from self.generate(*args, **kwargs)

        signature = inspect.signature(self.generate)
        types = {
            **typing.get_type_hints(self.generate),
            "backend": Literal[tuple(BACKENDS)],
            "model": Literal[tuple(self.registry.names)],
            "window_mode": Literal[WINDOW_MODES],
            "unk_policy": Literal[UNK_POLICIES],
        }
        defaults = {"backend": self.default_backend, "model": self.default_model}
        parameters = [
            p.replace(annotation=types[p.name], default=defaults.get(p.name, p.default))
            for p in signature.parameters.values()
        ]
        generate.__signature__ = signature.replace(parameters=parameters, return_annotation=str)
        generate.__annotations__ = {**{p.name: p.annotation for p in parameters}, "return": str}
        generate.__doc__ = DemoHandlers.generate.__doc__
        generate.__name__ = generate.__qualname__ = "generate"
        return generate

    @sends_updates
    def ui_generate(self, page: gr.Request, ticket: str | None, *form):
        """The Generate button (`form`: the `PAGE_FIELDS`): yields (output: prompt + text so far, stats, status). A bad
        request or a failure is said once, in the status line (starting with `FAILED`), beside an empty output: no
        text of an earlier run stays beside it."""
        if page is not None:
            self.stops.supersede((page.session_hash, "generate"), ticket)
        try:
            request = self._parse_page(form)
            progress = stream_progress(
                self.registry,
                request,
                self.activity,
                should_stop=lambda: self.stops.is_stopped(ticket),
                poll_interval=self.interval,
                unk_hint=PAGE_UNK_HINT,
            )
            for p in throttle(progress, self.interval):
                status = "Stopped." if p.stopped else "Done." if p.done else "Generating…"
                yield p.prompt + p.text, stats_line(p, request) if p.tokens or p.done else "", status
        except RequestError as e:
            yield "", "", f"{FAILED} {page_message(e)}"
        except Exception as e:
            logger.exception("generation failed")
            yield "", "", f"{FAILED} generation failed: {type(e).__name__}: {e}"
        finally:
            self.stops.forget(ticket)

    def ui_attention(self, prompt, model, unk_policy, layer, status):
        """After a run: (heat maps of `layer`, the view's state for the layer selector, layer choices, caption).

        After a failed run (`status` starts with `FAILED`) the view stays empty: the status line says why. The
        state is what the view was computed from (the model and the last `block_size` ids), not the weights: the
        layer selector recomputes them, so a page session keeps a few hundred bytes on the server."""
        empty = None, None, gr.skip(), ""
        if not isinstance(prompt, str) or not prompt or len(prompt) > MAX_PROMPT_CHARS:
            return empty
        if not isinstance(status, str) or status.startswith(FAILED):
            return empty
        try:
            name = self.registry.resolve_model(model)
            loaded = self.registry.backend(name, "torch")
            ids = encode_prompt(loaded.vocab, prompt, unk_policy if unk_policy in ("replace", "drop") else "error")
            state = (name, tuple(ids[-loaded.block_size :]))
            n_layer = loaded.backend.pretrained.config.n_layer
            layer = layer if isinstance(layer, int) and 0 <= layer < n_layer else 0
            image, caption = self._view(state, layer)
        except RequestError as e:
            return None, None, gr.skip(), f"No attention view: {e}"
        except ImportError as e:  # an ONNX-only install: the view needs the PyTorch model
            return None, None, gr.skip(), f"No attention view: it needs PyTorch ({e})"
        layers = gr.Radio(choices=[(f"layer {i}", i) for i in range(n_layer)], value=layer)
        return image, state, layers, caption

    def ui_layer(self, state, layer):
        """The layer selector: (heat maps, caption) of another layer of the view `ui_attention` computed."""
        if not (isinstance(state, tuple) and len(state) == 2) or isinstance(layer, bool) or not isinstance(layer, int):
            return gr.skip(), gr.skip()
        try:
            return self._view(state, layer)
        except (RequestError, ImportError, IndexError):
            return gr.skip(), gr.skip()

    def _view(self, state: tuple[str, tuple[int, ...]], layer: int):
        """(heat maps, caption) of `layer` of `state` = (model, ids); the weights are computed on the model's
        decode-loop thread (the one that runs it, see `Scheduler.call`). IndexError for a layer it does not have."""
        name, ids = state
        loaded = self.registry.backend(name, "torch")
        weights = self._weights.get(state)
        if weights is None:
            weights = self.registry.scheduler(name, "torch").call(
                prompt_attention, loaded.backend.pretrained, list(ids)
            )
            with self._weights_lock:
                self._weights[state] = weights
                while len(self._weights) > ATTENTION_CACHE:  # the last few views: switching layers reruns nothing
                    self._weights.popitem(last=False)
        if not 0 <= layer < len(weights):
            raise IndexError(f"layer {layer} of a model with {len(weights)}")
        n_layer, n_head, _, _ = weights.shape
        chars = loaded.vocab.decode(list(ids))
        return render_heads(weights[layer], chars), attention_caption(n_layer, n_head, layer, chars)

    def ui_model_info(self, model, backend):
        """One line about the selected model, and whether the selected backend can serve it."""
        return model_line(self.registry, model, backend)

    def ui_model_sampling(self, model):
        """Another model chosen: the sampling sliders at its defaults (its folder's generation_config.json; the form's
        own where it sets none, or where it cannot be read: a run then says why)."""
        try:
            defaults = self.registry.generation_defaults(model)
        except RequestError:
            defaults = {}
        return tuple(defaults.get(name, FORM[name]["default"]) for name in SAMPLING_SLIDERS)

    def ui_model_prompts(self, model, prompt):
        """Another model chosen: its sample prompts as the examples (hidden when it records none), and its first
        prompt in place of the prompt when that is still some model's example or empty (a typed one stays)."""
        record = self.registry.corpus(model) if model in self.registry.names else None
        examples = example_prompts(record)
        offered = {p for name in self.registry.available for p in (getattr(self.registry.corpus(name), "prompts", ()))}
        keep = isinstance(prompt, str) and prompt and prompt not in offered
        new_prompt = gr.skip() if keep or record is None else record.default_prompt
        return gr.Dataset(samples=examples or [[""]], visible=bool(examples)), new_prompt

    @sends_updates
    def ui_compare(self, page: gr.Request, ticket: str | None, *form):
        """The comparison (`form`: the `PAGE_FIELDS`, its model ignored): yields (one text per column of `columns`...,
        status: the prompt and seed they all got). A column that cannot run says why (and the status how many ran);
        a bad request empties the columns and says why in the status."""
        if page is not None:
            self.stops.supersede((page.session_hash, "compare"), ticket)
        try:
            base = self._parse_page(form)
            streams = [
                column.problem
                or column.registry.unavailable_reason(column.name, base.backend)
                or in_page_words(
                    stream_progress(
                        column.registry,
                        base,
                        self.activity,
                        should_stop=lambda: self.stops.is_stopped(ticket),
                        unk_hint=PAGE_UNK_HINT,
                        model=column.name,
                    )
                )
                for column in self.columns
            ]
            failed: set[int] = set()
            for texts in stream_side_by_side(streams, self.interval, failed):
                yield *texts, compare_status(base.prompt, base.seed, "running")
            end = "stopped" if self.stops.is_stopped(ticket) else "done"
            status = compare_status(base.prompt, base.seed, end, failed=len(failed), columns=len(streams))
            yield *[gr.skip()] * len(self.compared), status
        except RequestError as e:
            yield *[""] * len(self.compared), f"{FAILED} {page_message(e)}"
        finally:
            self.stops.forget(ticket)

    def ui_stop(self, generate_ticket, compare_ticket, page: gr.Request = None):
        """A Stop button: ends the page's runs of the kinds whose tickets it sends after their current token (the
        Stop beside Generate sends Generate's ticket only, the comparison's Stop the comparison's)."""
        self.stops.stop(generate_ticket, compare_ticket)  # runs still waiting in the queue
        kinds = tuple(kind for kind, ticket in (("generate", generate_ticket), ("compare", compare_ticket)) if ticket)
        if page is not None and kinds:
            self.stops.stop_page(page.session_hash, kinds)  # and the page's running ones, whichever ticket it holds

    def ui_generate_ended(self, page: gr.Request = None):
        """After a Generate run of the page: its Stop stays enabled only while another Generate run of it is on."""
        return self._stop_button(page, "generate")

    def ui_compare_ended(self, page: gr.Request = None):
        """After a comparison of the page: its Stop stays enabled only while another comparison of it is on."""
        return self._stop_button(page, "compare")

    def _stop_button(self, page, kind: str):
        # (the page enables a Stop when its run is asked for; a run still waiting in the queue is not counted here)
        return gr.Button(interactive=page is not None and self.stops.has_runs(page.session_hash, (kind,)))


# The fields of a generation request: the /generate API's parameters, in order.
FIELDS = tuple(inspect.signature(DemoHandlers.generate).parameters)[1:]
# The page's form, in the order the page passes it: the fields, its Format control (`demo.format_control`: a kind and
# a text) in place of structured_outputs.
PAGE_FIELDS = (*(name for name in FIELDS if name != "structured_outputs"), "format", "format_text")
