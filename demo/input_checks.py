"""What every event of the page checks before its function runs: the number of values and their kinds, each
failure a `gr.Error` that names the event and what it takes (Gradio's own checks answer `{"error": null}`); and
/generate's parameters described on the API page."""

from __future__ import annotations

import gradio as gr


def explain_bad_inputs(demo: gr.Blocks) -> None:
    """Gradio answers `{"error": null}` when an event's inputs fail its own checks (too few values) or its
    components' preprocessing (a string where a Dataset wants an index): this demo's answers say what was wrong."""
    demo.validate_inputs = _validate_inputs
    preprocess = demo.preprocess_data

    async def preprocess_data(block_fn, inputs, state, explicit_call: bool = False):
        try:
            return await preprocess(block_fn, inputs, state, explicit_call)
        except gr.Error:
            raise
        except Exception as e:
            what = f"{type(e).__name__}: {str(e)[:200]}"
            raise gr.Error(
                f"{block_fn.api_name or block_fn.name}: an input value was not understood ({what})"
            ) from None

    demo.preprocess_data = preprocess_data


OBJECT_INPUTS = ("structured_outputs",)  # /generate's inputs that take a JSON object (named by `describe_parameters`)


def _validate_inputs(block_fn, inputs: list) -> None:
    """Replaces Gradio's check of an event's input values (its ValueError reaches a client as `{"error": null}`, and
    it lets extra values through unread): too few or too many values, or a list or dict (a file-shaped value, say)
    where an input takes text or a number (all but /generate's `OBJECT_INPUTS`), get a `gr.Error` that names the
    event and what it takes."""
    names = [getattr(block, "label", None) or type(block).__name__ for block in block_fn.inputs]
    event = block_fn.api_name or block_fn.name
    if len(inputs) != len(block_fn.inputs):
        raise gr.Error(
            f"{event} takes {len(block_fn.inputs)} values ({', '.join(map(str, names))}), got {len(inputs)}",
            print_exception=False,
        )
    for block, name, value in zip(block_fn.inputs, names, inputs):
        # a State's value is the server's own; an object input's value is checked by the request specification
        if not block.stateful and name not in OBJECT_INPUTS and isinstance(value, (dict, list)):
            raise gr.Error(
                f"{event}: {name} takes text or a number, got a {type(value).__name__} (files are not accepted)",
                print_exception=False,
            )


def describe_parameters(block_fn) -> None:
    """Puts each parameter's line of the function's `Args:` docstring into the API page's schema (Gradio reads it
    only for MCP tools), and names each input after its parameter instead of "1st", "2nd"..."""
    _, descriptions, _ = gr.utils.get_function_description(block_fn.fn)
    for component, name in zip(block_fn.inputs, descriptions, strict=True):
        text = descriptions[name]
        component._api_info = {**component._api_info, "description": text, "additional_description": text}
        component.label = name
