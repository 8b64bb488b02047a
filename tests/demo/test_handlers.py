"""What the page's event functions say and show, without a browser: the attention view and its caption, the stats
line past block_size, the Stop button's state, each error said once."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr
import pytest

from demo.attention import VIEW_POSITIONS
from demo.captions import attention_caption, stats_line
from demo.progress import GenerationRequest, Progress
from tests.demo.conftest import form


def test_the_attention_view_shows_the_characters_the_model_read(handlers):
    view, state, layers, caption = handlers.ui_attention("To be,\nor not", "tiny", "error", 1, "Done.")
    assert view.count('<figure class="attn-head">') == 4 and 'data-n="13" data-start="0"' in view
    assert state[0] == "tiny" and len(state[1]) == 13 and layers.value == 1
    assert caption.startswith("Layer 1 (of layers 0–1) · heads 0–3 · the last 13 prompt characters on both axes:")
    assert "`To·be,↵or·not` (query ↓, key →; ↵ = newline, · = space)" in caption
    again, caption_again = handlers.ui_layer(state, 1)
    assert caption_again == caption and again == view
    assert handlers.ui_layer(state, 0)[0] != view
    assert handlers.ui_layer(state, 2) == (gr.skip(), gr.skip())  # tiny has layers 0 and 1 only


def test_the_attention_view_keeps_the_last_block_size_characters(handlers):
    prompt = "First Citizen:\nBefore we proceed"
    _, state, _, caption = handlers.ui_attention(prompt, "tiny", "error", 0, "Stopped.")
    assert len(state[1]) == 16  # tiny's block_size
    assert "the last 16 prompt characters on both axes: `efore·we·proceed`" in caption


def test_after_a_failed_run_the_view_is_empty_and_says_nothing_more(handlers):
    """The status line names the unknown characters; the caption does not repeat it."""
    status = list(handlers.ui_generate(None, None, *form(prompt="ROMEO: é")))[-1][2]
    assert status.startswith("⚠️") and "'é' (position 7)" in status
    assert handlers.ui_attention("ROMEO: é", "tiny", "error", 0, status) == (None, None, gr.skip(), "")


def test_the_caption_numbers_from_zero_and_counts_correctly():
    one = attention_caption(1, 1, 0, "a")
    assert one.startswith("Layer 0 (the only layer) · head 0 · the last 1 prompt character on both axes: `a` (")
    long = attention_caption(4, 6, 3, "x" * 128)
    assert long.startswith("Layer 3 (of layers 0–3) · heads 0–5 · the last 128 prompt characters")
    assert (
        f"the maps show the last {VIEW_POSITIONS}, and their first column (…) sums each row's weight on the 96 keys"
        in long
    )
    assert "the maps show" not in attention_caption(4, 6, 3, "x" * VIEW_POSITIONS)


def progress(tokens: int, prompt: str = "ROMEO:", block_size: int = 16) -> Progress:
    return Progress(prompt, "x" * tokens, tokens, 0.01, 1.0, 0.5, block_size=block_size)


@pytest.mark.parametrize(
    ("window_mode", "tokens", "says_why"), [("exact", 10, False), ("exact", 11, True), ("refill", 40, False)]
)
def test_the_stats_say_why_exact_mode_slows_down_past_block_size(window_mode, tokens, says_why):
    request = GenerationRequest("ROMEO:", 40, seed=1, backend="torch", model="tiny", window_mode=window_mode)
    line = stats_line(progress(tokens), request)
    assert line.startswith(f"**{tokens}** / 40 tokens")
    assert ("passed block_size (16): exact mode reruns the model" in line and "**refill**" in line) == says_why


def test_one_token_is_singular():
    request = GenerationRequest("ROMEO:", 1, seed=1, backend="torch", model="tiny")
    assert stats_line(progress(1), request).startswith("**1** / 1 token ·")


def test_a_stream_past_block_size_says_so_in_its_stats(handlers):
    *_, (_, stats, status) = handlers.ui_generate(None, None, *form(max_new_tokens=30))
    assert status == "Done." and "passed block_size (16)" in stats
    *_, (_, stats, _) = handlers.ui_generate(None, None, *form(max_new_tokens=30, window_mode="refill"))
    assert "block_size" not in stats


def test_each_stop_is_enabled_only_while_its_run_of_the_page_is_on(handlers):
    page = SimpleNamespace(session_hash="page-stop")
    assert handlers.ui_generate_ended(page).interactive is False
    compare = handlers.ui_compare(page, "compare-run", *form(max_new_tokens=400))
    next(compare)
    generate = handlers.ui_generate(page, "generate-run", *form(max_new_tokens=400))
    next(generate)
    assert handlers.ui_generate_ended(page).interactive is True and handlers.ui_compare_ended(page).interactive is True
    list(generate)
    assert handlers.ui_generate_ended(page).interactive is False  # generate ended: its Stop is off
    assert handlers.ui_compare_ended(page).interactive is True  # the comparison is still on
    assert handlers.ui_compare_ended(SimpleNamespace(session_hash="another-page")).interactive is False
    compare.close()
    assert handlers.ui_compare_ended(page).interactive is False
    assert handlers.ui_generate_ended(None).interactive is False


def test_each_stop_stops_its_own_run_only(handlers):
    page = SimpleNamespace(session_hash="page-two-stops")
    compare = handlers.ui_compare(page, "c-run", *form(max_new_tokens=400))
    generate = handlers.ui_generate(page, "g-run", *form(max_new_tokens=400))
    next(compare), next(generate)
    handlers.ui_stop("", "c-other", page=page)  # the comparison's Stop (its ticket box since overwritten)
    assert list(compare)[-1][-1].startswith("Stopped: the prompt")
    assert next(generate)[2] == "Generating…"  # Generate's run goes on
    handlers.ui_stop("g-run", "", page=page)
    assert list(generate)[-1][2] == "Stopped."


def test_an_error_empties_the_outputs_beside_it(handlers):
    """No text of an earlier run stays beside an error: the output and every comparison column are emptied."""
    assert list(handlers.ui_generate(None, None, *form(prompt="é")))[-1][:2] == ("", "")
    *columns, status = list(handlers.ui_compare(None, None, *form(temperature=5)))[-1]
    assert status.startswith("⚠️") and columns == [""] * len(handlers.compared)


def test_the_sliders_and_generate_take_the_chosen_models_generation_config(handlers):
    """A model chosen sets the sampling sliders to its folder's generation_config.json; /generate's None is that."""
    defaults = handlers.registry.generation_defaults("tiny")
    assert handlers.ui_model_sampling("tiny") == (defaults["max_new_tokens"], defaults["temperature"], 0, 1.0)
    assert handlers.ui_model_sampling("ladder-c") == (300, 0.8, 0, 1.0)  # missing: the form's own (a run says why)
    texts = list(handlers.generate("ROMEO:", max_new_tokens=None, seed=3, model="tiny"))
    assert len(texts[-1]) == defaults["max_new_tokens"]
    greedy = list(handlers.generate("ROMEO:", max_new_tokens=5, temperature=0, seed=3, model="tiny"))[-1]
    assert list(handlers.generate("ROMEO:", max_new_tokens=5, temperature=0, seed=4, model="tiny"))[-1] == greedy
