"""Text from a file put into Markdown as text: a corpus's name or description on the demo's page and in a model
card must not become a link, an image, emphasis, HTML or a table's column break.

Torch-free and pure Python.
"""

from __future__ import annotations

import re

# What inline Markdown (GitHub's, the Hub's, Gradio's) reads as syntax: emphasis, code, links and images, HTML and
# entities, tables' columns, strikethrough, Gradio's LaTeX. CommonMark shows a backslash-escaped one as itself.
_SYNTAX = re.compile(r"([\\`*_\[\]<>|~&$!#])")


def escape(text: str) -> str:
    """`text` as inline Markdown that shows exactly `text`, on one line: its syntax characters backslash-escaped,
    its line breaks (which would end a table row or a paragraph) shown as spaces."""
    return _SYNTAX.sub(r"\\\1", " ".join(text.splitlines()))


__all__ = ["escape"]
