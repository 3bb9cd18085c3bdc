"""Stable hashes of what is sent to a model: the keys under which paid replies are kept.

The response cache, the training call ledger and the batch call ledger each key a reply by a hash of its
request; they hash different parts (the cache adds the endpoint and the sampling, the ledgers do not), but the
same way, here, so a key written by one version is found by the next.

    >>> stable_hash(["m", [["human", "hi"]]]) == stable_hash(["m", [["human", "hi"]]])
    True
    >>> len(stable_hash([])), len(stable_hash([], digest_size=20))
    (32, 40)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

__all__ = ["message_texts", "stable_hash"]


def stable_hash(body: Any, digest_size: int = 16) -> str:
    """BLAKE2b of `body` as JSON (non-ASCII kept as is), in hex: `digest_size` bytes, twice as many digits."""
    return hashlib.blake2b(
        json.dumps(body, ensure_ascii=False).encode("utf-8"), digest_size=digest_size
    ).hexdigest()


def message_texts(messages: Sequence[Any]) -> list[list[str]]:
    """Each chat message as [role, text]: what a request hash covers of a message (its id and metadata are not
    sent as text, so two equal conversations hash the same). Content that is not text is hashed by its repr."""
    return [
        [getattr(m, "type", ""), m.content if isinstance(m.content, str) else repr(m.content)]
        for m in messages
    ]
