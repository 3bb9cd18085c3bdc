"""A Griffe extension for the API reference: a docstring's `>>>` examples, with the output under them, are shown
as code. The docstrings are prose, not Markdown; unfenced, an example's output such as `['a', 'b']` would read as
a Markdown link."""

from __future__ import annotations

import re
from typing import Any

import griffe

_PROMPT = re.compile(r"^( {0,3})>>>( |$)")  # four spaces or more: already an indented code block


def fence_examples(text: str) -> str:
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        match = _PROMPT.match(lines[i])
        if match is None:
            out.append(lines[i])
            i += 1
            continue
        indent, block = match.group(1), []
        while i < len(lines) and lines[i].strip():
            block.append(lines[i][len(indent) :])
            i += 1
        out += ["", f"{indent}```pycon", *(indent + line for line in block), f"{indent}```", ""]
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_examples(obj.docstring.value)
