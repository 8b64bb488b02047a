"""A model folder's `generation_config.json` as the defaults of a request that names none, as vLLM's
`--generation-config auto` reads it: `max_new_tokens`, `temperature`, `top_k`, `top_p`, `repetition_penalty` and
`min_p` where the file sets them (`do_sample: false` is transformers' greedy: temperature 0). Every value is checked
by the request specification (`fields.check_value`): a bad one is a ValueError naming the file and the field.
`"vllm"` (vLLM's spelling) ignores the file: the specification's own defaults. numpy-free, torch-free.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..files import read_json_object
from .fields import RequestError, check_value, show_value

GENERATION_CONFIG_FILE = "generation_config.json"
GENERATION_CONFIG_MODES = ("auto", "vllm")  # the folder's defaults, or the specification's (`--generation-config`)
# the request fields a folder's generation config sets (transformers' names are the specification's)
FOLDER_FIELDS = ("max_new_tokens", "temperature", "top_k", "top_p", "repetition_penalty", "min_p")


def check_mode(mode: Any) -> str:
    if mode not in GENERATION_CONFIG_MODES:
        raise ValueError(
            f"generation_config must be one of {list(GENERATION_CONFIG_MODES)} ('auto': the model folder's "
            f"generation_config.json; 'vllm': the built-in defaults), got {show_value(mode)}"
        )
    return mode


def read_generation_defaults(folder: str | os.PathLike, mode: str = "auto") -> dict[str, Any]:
    """The request defaults of the model folder `folder` (see the module docstring): field -> checked value, empty
    without a file or with `mode` "vllm"."""
    if check_mode(mode) == "vllm":
        return {}
    path = Path(folder) / GENERATION_CONFIG_FILE
    config = read_json_object(path)
    if config is None:
        return {}
    defaults = {}
    for name in FOLDER_FIELDS:
        if config.get(name) is not None:
            try:
                defaults[name] = check_value(name, config[name])
            except RequestError as e:
                raise ValueError(f"{path}: {e}") from None
    do_sample = config.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ValueError(f"{path}: do_sample must be true or false, got {show_value(do_sample)}")
    if do_sample is False:  # transformers' greedy search, whatever the temperature says
        defaults["temperature"] = 0.0
    return defaults
