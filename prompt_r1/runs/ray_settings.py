"""How a batch or eval run uses Ray (`--ray [ADDRESS]`, `--ray-actors`, `--ray-actor-cpus`, `--ray-actor-gpus`): one
typed object, checked when built, so that a bad address or size is refused before a file is touched or Ray is
imported.

    RaySettings()                                  # a local Ray, started for the run (and a local rate store)
    RaySettings("auto", actors=8, actor_gpus=1)    # the cluster this machine belongs to
    RaySettings("ray://head:10001")                # a remote cluster through Ray Client
    RaySettings("10.0.0.5:6379")                   # a cluster's GCS address
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prompt_r1.core.checks import number
from prompt_r1.core.errors import ConfigError

__all__ = ["CONNECT_SECONDS", "RAY_EXTRA_HINT", "RaySettings"]

RAY_EXTRA_HINT = "pip install 'prompt-r1[ray]'"
# How long an address given to --ray may take to answer as a Ray cluster before the run is refused (exit 3): Ray's
# own connect retries for minutes on an address that takes connections and never answers as Ray does.
CONNECT_SECONDS = 15.0

# host:port, with a host name, an IPv4 address or a bracketed IPv6 address; the port 1 to 65535.
_HOST_PORT = re.compile(r"^(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?):(\d{1,5})$")


@dataclass(frozen=True)
class RaySettings:
    """address: None (start a local Ray for the run), "auto" (the cluster this machine has joined), "ray://HOST:PORT"
    (Ray Client) or "HOST:PORT" (a cluster's GCS). actors: episode actors, each holding one agent and one
    environment client. actor_cpus, actor_gpus: what each actor reserves (a GPU for an in-process model).
    flags: name settings in errors as the command line does."""

    address: str | None = None
    actors: int = 2
    actor_cpus: float = 1.0
    actor_gpus: float = 0.0
    flags: bool = False

    def __post_init__(self) -> None:
        def name(flag: str) -> str:
            return "--" + flag if self.flags else flag.replace("ray-", "").replace("-", "_")

        number(self.actors, name("ray-actors"), integer=True, minimum=1)
        number(self.actor_cpus, name("ray-actor-cpus"), minimum=0)
        number(self.actor_gpus, name("ray-actor-gpus"), minimum=0)
        if self.address is not None:
            object.__setattr__(self, "address", check_address(self.address, name("ray")))

    @property
    def local(self) -> bool:
        """A Ray started by this run on this machine (its actors can reach a store on 127.0.0.1)."""
        return self.address is None


def check_address(address: str, flag: str = "--ray") -> str:
    """The address as Ray takes it, or a `ConfigError` naming the forms it may take.

    >>> check_address("ray://head:10001"), check_address("auto"), check_address("10.0.0.5:6379")
    ('ray://head:10001', 'auto', '10.0.0.5:6379')
    """
    text = str(address).strip()
    hostport = text[len("ray://") :] if text.startswith("ray://") else text
    match = _HOST_PORT.match(hostport)
    if text == "auto" or (match and 1 <= int(match.group(1)) <= 65535):
        return text
    raise ConfigError(
        f"{flag} {address!r} is not a Ray address: give none (a local Ray), auto, ray://HOST:PORT or HOST:PORT"
    )
