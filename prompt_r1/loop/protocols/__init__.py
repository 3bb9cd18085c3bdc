"""The loop's protocols, one object each, behind one interface (`base.LoopProtocol`): what the agent is shown, how
its output is parsed, the chat template, what the environment receives, how turns end, and what the trainer and
the evaluation score.

- `paper`: the paper's loop (the default); `release`: the reference release's rollout token for token
  (`--protocol release`), with its chat template (`release_chat_template.jinja`) and `release_calls`, the JSON
  calls and replies of its stream.

    protocol = protocol_for(LoopConfig(protocol="release"))   # chosen once; every site asks it

Add a protocol: a `LoopProtocol` subclass in a module here, its name in `PROTOCOLS` below, and its config rules in
`prompt_r1.core.config.PROTOCOL_RULES`.
"""

from __future__ import annotations

from typing import Any

from prompt_r1.core.errors import ConfigError
from prompt_r1.loop.protocols.base import LoopProtocol
from prompt_r1.loop.protocols.paper import PaperProtocol
from prompt_r1.loop.protocols.release import ReleaseProtocol

__all__ = ["PROTOCOLS", "LoopProtocol", "PaperProtocol", "ReleaseProtocol", "protocol_for"]

PROTOCOLS: dict[str, LoopProtocol] = {p.name: p for p in (PaperProtocol(), ReleaseProtocol())}


def protocol_for(loop: Any) -> LoopProtocol:
    """The protocol of a loop config (anything with a `protocol` name), or of a protocol's name."""
    name = loop if isinstance(loop, str) else loop.protocol
    if name not in PROTOCOLS:
        raise ConfigError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {name!r}")
    return PROTOCOLS[name]
