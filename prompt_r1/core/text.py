"""Text that is valid Unicode all the way through: what may come in, what gets repaired.

A Python `str` can hold a lone surrogate (U+D800–U+DFFF), which JSON allows as an escape (`"\\ud800"`) but which
no UTF-8 file, socket or terminal can take: writing it raises `UnicodeEncodeError`, long after it came in.
So input the user controls (dataset rows, requests) is refused where it enters, naming where it is, and text a
model or server produced is repaired on arrival (each bad code point becomes U+FFFD) and flagged in the record.

    >>> valid("caf\\u00e9"), valid("half \\ud800 pair")
    (True, False)
    >>> repair("half \\ud800 pair")
    ('half \\ufffd pair', True)
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["REPLACEMENT", "before_stop", "lone_surrogate", "repair", "valid"]

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid(text: str) -> bool:
    """True when `text` encodes as UTF-8 (it holds no lone surrogate)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def repair(text: str) -> tuple[str, bool]:
    """(`text` with every code point UTF-8 cannot encode replaced by U+FFFD, whether anything was replaced)."""
    if valid(text):
        return text, False
    return _SURROGATE.sub(REPLACEMENT, text), True


def lone_surrogate(text: str) -> str | None:
    """Why `text` cannot be written as UTF-8, for an error message naming where, or None when it can.

    >>> print(lone_surrogate("a " + chr(0xD800) + " b"))
    a lone surrogate \\ud800 at character 2
    >>> print(lone_surrogate("Île-de-France"))
    None
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"a lone surrogate \\u{ord(text[exc.start]):04x} at character {exc.start}"
    return None


def before_stop(text: str, stop: Sequence[str] | None) -> str:
    """`text` up to the first of the `stop` sequences, as a model stops before writing one: how the surfaces
    that take a caller's stop sequences (serve's `stop`, PromptR1Chat's `stop=`, serve-model's) honour them.

    >>> before_stop("Paris. Also Lyon.", [".", "Also"])
    'Paris'
    """
    cut = min((i for i in (text.find(s) for s in stop or () if s) if i >= 0), default=len(text))
    return text[:cut]
