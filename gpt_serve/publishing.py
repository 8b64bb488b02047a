"""A model folder written out as a self-contained copy: what plain transformers needs, and a Hub repository holds.

The shipped folders (`gpt_serve.models`) hold data only: the package's classes read them. A copy for someone
without gpt-serve (`gpt-serve copy NAME OUT`, `write_self_contained`) also holds the model's code, the files
`save_pretrained` copies for `trust_remote_code=True` (`configuration_chargpt.py`, `modeling_chargpt.py`,
`window.py`) with `auto_map` in its `config.json`, and its model card says how to load it that way. Everything
else of the folder (the ONNX graphs, the card's figures, metrics) is copied as it is. Written whole or not at all
(`gpt_serve.writing.write_new_folder`).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from .writing import write_new_folder

REMOTE_CODE_USE = """## Use

This folder holds its own model code: plain transformers loads it with `trust_remote_code=True` (no gpt-serve
needed; the tokenizer is `tokenizer.json`, which needs no code).

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("PATH", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("PATH", trust_remote_code=True)
ids = tokenizer("ROMEO:", return_tensors="pt").input_ids
print(tokenizer.decode(model.generate(ids, max_new_tokens=200, do_sample=True)[0]))
```

With gpt-serve installed, `gpt-serve generate PATH` and `gpt-serve serve --model-dir PATH` run it too.

"""


def write_self_contained(source: str | os.PathLike, out: str | os.PathLike, replace: bool = False) -> Path:
    """Writes a self-contained copy of the model folder `source` (a path, or a shipped model's name) to `out`."""
    from . import CharGPTForCausalLM, CharTokenizer
    from .generation.loading import check_vocab
    from .models import model_path, read_config

    folder = model_path(source)
    check_vocab(folder, read_config(folder))  # a folder whose files disagree is not copied on
    model = CharGPTForCausalLM.from_pretrained(folder)
    tokenizer = CharTokenizer.from_pretrained(folder)

    def write(tmp: Path) -> None:
        shutil.copytree(folder, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
        model.save_pretrained(tmp)  # the weights, config.json with auto_map, the code files
        tokenizer.save_pretrained(tmp)
        card = tmp / "README.md"
        if card.is_file():
            card.write_text(with_remote_code_use(card.read_text(encoding="utf-8")), encoding="utf-8")

    return write_new_folder(out, write, replace=replace)


def with_remote_code_use(card: str) -> str:
    """`card` (a model card) with its "## Use" section saying how plain transformers loads the folder."""
    section = re.compile(r"^## Use\n.*?(?=^## |\Z)", re.S | re.M)
    if section.search(card):
        return section.sub(lambda _: REMOTE_CODE_USE, card, count=1)
    return card.rstrip("\n") + "\n\n" + REMOTE_CODE_USE


__all__ = ["write_self_contained", "with_remote_code_use"]
