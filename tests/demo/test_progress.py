"""The demo's streaming without a server: the /generate function, the stats, the throttle, stopping, bad input."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
import time
import warnings
from pathlib import Path

import gradio as gr
import pytest

from demo.progress import (
    Activity,
    Progress,
    RequestError,
    StopRequests,
    parse_form,
    stream_progress,
    stream_side_by_side,
    throttle,
)
from gpt_serve.generation import LoadedModel, SamplingParams, generate_text
from gpt_serve.generation.fields import MAX_NEW_TOKENS
from tests.demo.conftest import GOOD, form


def test_generate_yields_growing_prefixes_and_ends_at_requested_length(handlers):
    outs = list(handlers.generate("ROMEO:", max_new_tokens=50, seed=0, model="tiny"))
    assert len(outs) == 50  # no throttle: one result per token
    assert [len(o) for o in outs] == list(range(1, 51))
    assert all(b.startswith(a) for a, b in zip(outs, outs[1:], strict=False))


@pytest.mark.parametrize("backend", ["torch", "onnx", "onnx-int8"])
@pytest.mark.parametrize("window_mode", ["exact", "refill"])
def test_every_backend_streams_past_block_size(handlers, backend, window_mode):
    outs = list(handlers.generate("ROMEO:", max_new_tokens=40, seed=1, backend=backend, window_mode=window_mode))
    assert len(outs[-1]) == 40  # tiny's block_size is 16: the window slides


def test_demo_text_is_the_engines_text(handlers, registry):
    """Same seed -> the same text as the engine called directly; greedy ONNX fp32 matches greedy PyTorch."""
    loaded = registry.backend("tiny", "torch")
    expected = generate_text(loaded.backend, loaded.vocab, "ROMEO:", 60, SamplingParams(0.8, top_k=20), seed=7)
    got = list(handlers.generate("ROMEO:", 60, temperature=0.8, top_k=20, seed=7, model="tiny"))[-1]
    assert got == expected
    greedy = [list(handlers.generate("JULIET:", 30, temperature=0, backend=b))[-1] for b in ("torch", "onnx")]
    assert greedy[0] == greedy[1]


def test_progress_reports_stats(registry):
    request = parse_form(registry, MAX_NEW_TOKENS, GOOD)
    progress = list(stream_progress(registry, request))
    assert [p.tokens for p in progress] == [0, *range(1, 41), 40]  # the prompt encoded, each token, the end
    assert [p.done for p in progress] == [False] * 41 + [True]
    assert {p.prompt for p in progress} == {"ROMEO:"}
    last = progress[-1]
    assert 0 < last.time_to_first_token <= last.elapsed
    assert last.tokens_per_second > 0
    assert progress[1].tokens_per_second is None  # one token: no decode speed yet


def test_throttle_keeps_first_latest_and_final():
    ticks = iter(range(0, 1000, 10))  # a fake clock in milliseconds, 10 ms per token
    states = [Progress("", "x" * i, i, 0.0, 0.0, 0.0, done=i == 20) for i in range(1, 21)]
    kept = list(throttle(iter(states), interval=50, clock=lambda: next(ticks)))
    assert [p.tokens for p in kept] == [1, 6, 11, 16, 20]
    # the prompt (no token yet) shows at once and does not hold the first token back
    ticks = iter(range(0, 1000, 10))
    kept = list(throttle(iter([Progress("p", "", 0, None, 0.0, 0.0), *states]), 50, clock=lambda: next(ticks)))
    assert [p.tokens for p in kept] == [0, 1, 6, 11, 16, 20]


def test_throttle_asks_a_changing_interval_at_every_state():
    ticks = iter(range(0, 1000, 10))
    states = [Progress("", "x" * i, i, 0.0, 0.0, 0.0, done=i == 20) for i in range(1, 21)]
    intervals = iter([50] * 6 + [100] * 100)  # longer from the 7th state on, as when more streams start
    kept = list(throttle(iter(states), interval=lambda: next(intervals), clock=lambda: next(ticks)))
    assert [p.tokens for p in kept] == [1, 6, 16, 20]


def test_the_update_interval_grows_with_the_runs_streaming(registry):
    """The budget is shared by the runs that stream updates to a client: a /generate call or a Generate click is
    one, a ladder comparison (one message per update for all of its columns) is one too."""
    from demo.handlers import DemoHandlers

    handlers = DemoHandlers(registry, MAX_NEW_TOKENS, Activity(), 0.05, "tiny", "torch", max_updates_per_second=10)
    unlimited = DemoHandlers(registry, MAX_NEW_TOKENS, Activity(), 0.05, "tiny", "torch", max_updates_per_second=None)
    assert handlers.interval() == unlimited.interval() == 0.05  # nothing running
    runs = [handlers.generate("ROMEO:", 400, seed=i, model="tiny", window_mode="refill") for i in range(4)]
    for run in runs:
        next(run)  # each run is streaming now
    assert handlers.interval() == pytest.approx(4 / 10)  # together at most ~10 updates a second
    compare = handlers.ui_compare(None, None, *form(max_new_tokens=400, window_mode="refill"))
    next(compare)
    assert handlers.interval() == pytest.approx(5 / 10)  # the comparison's columns count once
    for run in [*runs, compare]:
        run.close()
    assert handlers.interval() == 0.05 and handlers._updating == 0


def test_a_stream_that_looks_now_and_then_still_ends_as_soon_as_its_request_does(registry):
    """Between two looks the stream waits for its request's end, not for the whole interval: with an hour's
    interval a short request still ends at once (its tokens come in one look)."""
    request = parse_form(registry, MAX_NEW_TOKENS, {**GOOD, "max_new_tokens": 5})
    start = time.perf_counter()
    progress = list(stream_progress(registry, request, poll_interval=3600.0))
    assert progress[-1].done and progress[-1].tokens == 5
    assert time.perf_counter() - start < 60


def test_closing_the_stream_stops_the_compute(registry):
    """Gradio closes the generator on Stop or disconnect: no forward pass happens after that."""
    loaded = registry.backend("tiny", "torch")
    calls = []

    class Counting:  # counts the decode steps and full-window forwards the scheduler runs
        block_size, vocab_size = loaded.backend.block_size, loaded.backend.vocab_size

        def forward(self, *args):
            calls.append(1)
            return loaded.backend.forward(*args)

        def window_logits(self, ids):
            calls.append(1)
            return loaded.backend.window_logits(ids)

        def new_batch(self, max_rows):
            batch = loaded.backend.new_batch(max_rows)
            step = batch.step
            batch.step = lambda tokens: calls.append(1) or step(tokens)
            return batch

    class Registry(type(registry)):
        def backend(self, name, backend):
            return LoadedModel(loaded.folder, "torch", Counting(), 0.0)

    counting = Registry(registry.folders, threads=1)
    activity = Activity()
    limit = 20_000
    request = parse_form(counting, limit, {**GOOD, "max_new_tokens": limit})
    stream = stream_progress(counting, request, activity)
    assert next(stream).tokens == 0 and calls == []  # the prompt is encoded: no forward pass yet
    for _ in range(5):
        next(stream)
    assert activity.snapshot()["active"] == 1
    stream.close()
    scheduler = counting.scheduler("tiny", "torch")
    deadline = time.monotonic() + 5
    while scheduler.stats()["active"] and time.monotonic() < deadline:
        time.sleep(0.005)
    done = len(calls)
    time.sleep(0.1)
    assert len(calls) == done < limit  # the row left the batch: no forward pass since
    assert activity.snapshot() == dict(active=0, peak=1, started=1, finished=1, tokens=5)
    counting.close()


BAD_INPUTS = [
    (dict(prompt="ROMEO: é ü"), "2 characters outside this model's vocabulary: 'é' (position 7), 'ü' (position 9)"),
    (dict(prompt="ROMEO: é"), "the prompt has 1 character outside this model's vocabulary: 'é' (position 7)."),
    (dict(prompt="x" * 10_001), "prompt is 10,001 characters long; the limit is 10,000"),
    (dict(prompt=3), "prompt must be text, got int"),
    (dict(max_new_tokens=10**9), "max_new_tokens must be an integer in [1, 500], got 1000000000"),
    (dict(max_new_tokens=0), "max_new_tokens must be an integer in [1, 500], got 0"),
    (dict(max_new_tokens=2.5), "max_new_tokens must be an integer in [1, 500], got 2.5"),
    (dict(max_new_tokens="many"), "max_new_tokens must be an integer in [1, 500], got 'many'"),
    (dict(temperature=-1), "temperature must be a number in [0, 2] (0 = greedy), got -1"),
    (dict(temperature=float("nan")), "temperature must be a number in [0, 2] (0 = greedy), got nan"),
    (dict(temperature=5), "temperature must be a number in [0, 2] (0 = greedy), got 5"),
    (dict(top_k=-3), "top_k must be an integer in [0, 1000000] (0 = no limit), got -3"),
    (dict(top_p=0), "top_p must be a number in (0, 1], got 0"),
    (dict(top_p=1.5), "top_p must be a number in (0, 1], got 1.5"),
    (dict(seed=-5), "seed must be an integer in [0, 9007199254740991] (null or -1 = random), got -5"),
    (
        dict(seed=2**60),
        "seed must be an integer in [0, 9007199254740991] (null or -1 = random), got 1152921504606846976",
    ),
    (
        dict(backend="cuda"),
        "backend must be one of 'torch' (PyTorch), 'onnx' (ONNX Runtime fp32), 'onnx-int8' (ONNX Runtime int8), "
        "got 'cuda'",
    ),
    (dict(model="gpt-4"), "unknown model 'gpt-4': choose one of"),
    (dict(model="ladder-c"), "model 'ladder-c' is not available on this server: no model folder at"),
    (dict(model="ladder-a", backend="onnx"), "ONNX Runtime fp32 is not available for model 'ladder-a'"),
    (dict(window_mode="sideways"), "window_mode must be one of ['exact', 'refill']"),
    (dict(unk_policy="ignore"), "unk_policy must be one of ['error', 'drop', 'replace']"),
]


@pytest.mark.parametrize(("bad", "message"), BAD_INPUTS, ids=[m[:28] for _, m in BAD_INPUTS])
def test_bad_input_gets_a_clear_error(handlers, bad, message):
    kwargs = {**GOOD, **bad}
    with pytest.raises(gr.Error) as api_error:
        list(handlers.generate(**kwargs))
    assert message in api_error.value.message
    # the UI shows the same message once, in its status line (no toast: gr.Warning outside a request would be a
    # Python warning, an error here), beside an empty output: no earlier run's text stays beside it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        updates = list(handlers.ui_generate(None, None, *form(**bad)))
    assert updates == [("", "", updates[-1][2])]
    assert updates[-1][2].startswith("⚠️") and message in updates[-1][2]


def test_unknown_characters_can_be_replaced(handlers):
    assert len(list(handlers.generate("ROMEO: é", 20, seed=0, unk_policy="replace"))[-1]) == 20
    replaced = form(prompt="ROMEO: é", max_new_tokens=20, unk_policy="replace")
    updates = list(handlers.ui_generate(None, None, *replaced))
    assert updates[-1][0].startswith("ROMEO:  ") and updates[-1][2] == "Done."


def test_ui_stream_shows_prompt_then_text_and_stats(handlers):
    updates = list(handlers.ui_generate(None, None, *form(max_new_tokens=30, seed=-1)))
    assert updates[0] == ("ROMEO:", "", "Generating…")
    text, stats, status = updates[-1]
    assert len(text) == len("ROMEO:") + 30 and status == "Done."
    assert "**30** / 30 tokens" in stats and "tokens/s" in stats and "first token" in stats and "(random)" in stats


def test_seed_minus_one_and_none_are_random(registry):
    seeds = {parse_form(registry, MAX_NEW_TOKENS, {**GOOD, "seed": s}).seed for s in (None, -1, None, -1.0)}
    assert len(seeds) > 1


def test_side_by_side_streams_every_stage(registry):
    base = parse_form(registry, MAX_NEW_TOKENS, {**GOOD, "max_new_tokens": 25})
    streams = [
        stream_progress(registry, dataclasses.replace(base, model="ladder-a")),
        "ladder-c is missing",
        stream_progress(registry, dataclasses.replace(base, model="ladder-b")),
    ]
    final = list(stream_side_by_side(streams, interval=0.0))[-1]
    assert [len(final[0]), final[1], len(final[2])] == [25, "ladder-c is missing", 25]
    assert final[0] != final[2]  # different models, same seed


def test_ui_compare_runs_the_default_model_and_the_ladder(handlers):
    assert handlers.compared == ["tiny", "ladder-a", "ladder-b", "ladder-c", "ladder-d", "ladder-e"]
    updates = list(handlers.ui_compare(None, None, *form(prompt="JULIET:\nO Romeo", max_new_tokens=12, seed=5)))
    default, a, b, c, d, e, running = updates[-2]
    status = updates[-1][-1]  # the last update changes only the status
    assert len(default) == len(a) == len(b) == 12
    assert all("'ladder-" in t and "is not available" in t for t in (c, d, e))
    assert running == "Running the prompt `JULIET:↵O Romeo` (seed 5) through every column…"
    assert status == (  # never "the same settings in every column" over columns that could not run
        "Done: the prompt `JULIET:↵O Romeo` (seed 5) ran in 3 of 6 columns, the same settings in each; 3 columns "
        "could not run it (the column says why)."
    )


def test_backends_load_once_and_are_shared(models_root):
    from gpt_serve.serving.registry import ModelRegistry

    fresh = ModelRegistry.discover(models_root=models_root, threads=1)
    results = []
    threads = [threading.Thread(target=lambda: results.append(fresh.backend("tiny", "onnx"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(r.backend) for r in results}) == 1
    assert fresh.is_loaded("tiny", "onnx") and not fresh.is_loaded("tiny", "onnx-int8")


def test_parse_form_rejects_unknown_model_before_loading(registry):
    with pytest.raises(RequestError, match="unknown model"):
        parse_form(registry, MAX_NEW_TOKENS, {**GOOD, "model": "../etc"})


def test_stop_requests_end_the_stream_after_the_current_token(registry):
    stops = StopRequests()
    request = parse_form(registry, MAX_NEW_TOKENS, {**GOOD, "max_new_tokens": 500})
    activity = Activity()
    stream = stream_progress(registry, request, activity, should_stop=lambda: stops.is_stopped("t1"))
    for _ in range(4):  # the encoded prompt, then three tokens
        next(stream)
    stops.stop("t1")
    rest = list(stream)
    assert len(rest) == 1 and rest[0].done and rest[0].stopped and rest[0].tokens == 3
    assert activity.snapshot()["tokens"] == 3 and activity.snapshot()["active"] == 0


def test_a_run_stopped_before_it_starts_generates_nothing(handlers):
    handlers.ui_stop("queued-ticket", "")  # Stop clicked while the run still waited in the queue
    args = form(max_new_tokens=100, seed=0)
    updates = list(handlers.ui_generate(None, "queued-ticket", *args))
    assert updates[-1] == ("ROMEO:", updates[-1][1], "Stopped.") and "**0** / 100 tokens" in updates[-1][1]
    assert list(handlers.ui_generate(None, "queued-ticket", *args))[-1][2] == "Done."  # tickets are forgotten


def test_stop_ends_the_ladder_comparison(handlers):
    handlers.ui_stop("", "compare-ticket")
    final = list(handlers.ui_compare(None, "compare-ticket", *form(max_new_tokens=100, seed=5)))[-1]
    assert final[-1].startswith("Stopped: the prompt `ROMEO:` (seed 5) ran in 3 of 6 columns")


def test_model_info_and_column_labels_show_the_validation_loss(registry):
    from demo.captions import ladder_label, ladder_legend, model_line

    assert registry.info("ladder-a") == dict(block_size=8, n_embd=32, n_head=4, n_layer=1, vocab_size=65, val_loss=3.25)
    assert registry.info("tiny")["val_loss"] is None
    assert ladder_label("ladder-a", registry) == "A · val loss 3.25"  # short: every column's label is one line
    assert ladder_label("ladder-c", registry) == "C (not available)"
    assert ladder_label("tiny", registry) == "tiny"  # the default model's column
    assert ladder_legend(["tiny", "ladder-a", "ladder-c"], registry) == (
        "**tiny** 2 layers × 4 heads · **A** one self-attention head · "
        "**C** + feed-forward Linear -> ReLU after attention"
    )
    assert model_line(registry, "ladder-a", "torch") == (
        "`ladder-a` on Tiny Shakespeare: 1 layer × 4 heads, n_embd 32, block_size 8, validation loss 3.250 · PyTorch ✓"
    )


def test_generating_again_in_the_same_page_stops_the_previous_run(handlers):
    from types import SimpleNamespace

    page = SimpleNamespace(session_hash="page-1")
    args = form(max_new_tokens=400, seed=0)
    first = handlers.ui_generate(page, "ticket-1", *args)
    for _ in range(3):
        next(first)
    second = list(handlers.ui_generate(page, "ticket-2", *args))
    assert second[-1][2] == "Done."
    assert list(first)[-1][2] == "Stopped."
    other_page = handlers.ui_generate(SimpleNamespace(session_hash="page-2"), "ticket-3", *args)
    next(other_page)
    list(handlers.ui_generate(SimpleNamespace(session_hash="page-3"), "ticket-4", *args))
    assert list(other_page)[-1][2] == "Done."  # other pages are not affected


def test_stop_stops_the_pages_running_stream_whatever_ticket_it_sends(handlers):
    from types import SimpleNamespace

    page = SimpleNamespace(session_hash="page-9")
    run = handlers.ui_generate(page, "t-running", *form(max_new_tokens=400, seed=0))
    next(run), next(run)
    handlers.ui_stop("t-newer", "", page=page)  # the page's ticket box was overwritten by an ignored click
    assert list(run)[-1][2] == "Stopped."


@pytest.fixture(scope="module")
def own_model_root(tmp_path_factory, models_root):
    """The test models plus `code`: a model on another text (its own vocabulary) with its corpus.json."""
    from gpt_serve import CharTokenizer
    from gpt_serve.folders.corpus_record import CorpusRecord, write_corpus_record
    from tests.conftest import make_tiny_model

    root = Path(shutil.copytree(models_root, tmp_path_factory.mktemp("own") / "models"))
    text = "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int = 0\n\nimport os\n" * 40
    tokenizer = CharTokenizer.from_corpus(text)
    model = make_tiny_model(vocab_size=tokenizer.vocab_size)
    model.config.vocab_sha256 = tokenizer.vocab.sha256
    model.save_pretrained(root / "code")
    tokenizer.save_pretrained(root / "code")
    write_corpus_record(root / "code", CorpusRecord.of(text, name="tiny code", description="Python snippets"))
    return root


def test_the_page_presents_the_model_it_serves_and_compares_only_within_a_vocabulary(own_model_root):
    from demo.app import build_demo
    from gpt_serve.serving.registry import ModelRegistry

    registry = ModelRegistry.discover(models_root=own_model_root, threads=1)
    demo = build_demo(registry, default_model="code")
    config = json.dumps(demo.get_config_file(), default=str)
    code = registry.corpus("code")
    assert code.default_prompt == "def add(a, b):\n    return a + b"  # a paragraph's start, cut at its end
    assert "tiny code" in config and "Python snippets" in config and json.dumps(code.default_prompt) in config
    assert "Shakespeare" not in config and "ROMEO" not in config
    assert demo.title == "gpt-serve: Let's build GPT on tiny code"
    assert demo.handlers.compared == ["code"]  # no ladder stage reads its characters: no comparison on the page
    assert "compare-btn" not in config
    examples, prompt = demo.handlers.ui_model_prompts("tiny", code.default_prompt)  # the untouched default prompt
    assert prompt == "ROMEO:" and examples.raw_samples[0] == ["ROMEO:"]
    examples, prompt = demo.handlers.ui_model_prompts("code", "my own text")  # a typed prompt stays
    assert prompt == gr.skip() and examples.raw_samples[0] == [code.default_prompt]
    shakespeare = build_demo(registry, default_model="tiny")
    assert shakespeare.handlers.compared == ["tiny", "ladder-a", "ladder-b", "ladder-c", "ladder-d", "ladder-e"]
    assert "Tiny Shakespeare" in json.dumps(shakespeare.get_config_file(), default=str)


def test_a_corpus_name_is_shown_as_text_never_read_as_markdown(own_model_root, tmp_path):
    from demo.captions import intro, model_line, trained_on
    from gpt_serve.folders.corpus_record import CorpusRecord, write_corpus_record
    from gpt_serve.serving.registry import ModelRegistry

    record = CorpusRecord("[click](https://evil.example) <img src=x> **bold**", "a | b `c` _d_ $x$")
    line = trained_on(record)
    assert line == (
        r"trained on **\[click\](https://evil.example) \<img src=x\> \*\*bold\*\*** (a \| b \`c\` \_d\_ \$x\$)"
    )
    assert line in intro(record)
    root = Path(shutil.copytree(own_model_root, tmp_path / "models"))
    write_corpus_record(root / "code", record)
    registry = ModelRegistry.discover(models_root=root, threads=1)
    assert r"`code` on \[click\](https://evil.example) \<img src=x\> \*\*bold\*\*: " in model_line(
        registry, "code", "torch"
    )
