"""The flags, settings and exit codes that every command of `prompt-r1` shares.

Flags come from the config dataclasses (prompt_r1/core/config.py): every AgentConfig field is `--agent-<name>`,
every EnvironmentConfig field `--env-<name>`, every LoopConfig field `--<name>`; `configs_from_args` turns them,
over a `--config` file, into the typed configs once, at the command line's edge.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from dataclasses import MISSING, fields
from typing import Any

from prompt_r1.core.checks import flag_number, number
from prompt_r1.core.config import (
    AgentConfig,
    EnvironmentConfig,
    LoopConfig,
    load_config_file,
    unreachable_reason,
)
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.urls import MEMORY_STORE, is_shared_store, printable_url
from prompt_r1.runs.ray_settings import CONNECT_SECONDS

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_SPEND_CAP",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "CommandFailure",
    "add_deprecated_alias",
    "add_ray_flags",
    "check_ray_players",
    "ray_failures",
    "add_run_flags",
    "add_stop_flags",
    "build_players",
    "check_model",
    "check_rate_store",
    "check_reachable",
    "check_run_flags",
    "ray_settings_from",
    "configs_from_args",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
EXIT_SPEND_CAP = 4  # `prompt-r1 train` stopped, with a checkpoint, at max_env_cost or max_env_calls
_SECTIONS = (
    ("agent", AgentConfig, "agent-"),
    ("environment", EnvironmentConfig, "env-"),
    ("loop", LoopConfig, ""),
)


class CommandFailure(Exception):
    """A failure the user can act on, with its exit code: the command ends with its one line, no traceback."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _flag_type(type_name: str):
    if "bool" in type_name:
        return None
    if "int" in type_name:
        return int
    if "float" in type_name:
        return float
    return str


def add_run_flags(parser: argparse.ArgumentParser, *, repeatable_env: Sequence[str] = ()) -> None:
    """The agent, environment and loop flags shared by every command that runs episodes; the environment fields
    named in `repeatable_env` may be given several times (eval's sweep over environments)."""
    parser.add_argument(
        "--config", help="YAML/JSON file with agent/environment/loop sections (flags override it)."
    )
    for section, cls, prefix in _SECTIONS:
        group = parser.add_argument_group(f"{section} settings")
        for f in fields(cls):
            default = f.default if f.default is not MISSING else None
            flag = "--" + prefix + f.name.replace("_", "-")
            help_text = f"{f.metadata.get('help', '')} (default: {default})"
            dest = f"{section}__{f.name}"
            kind = _flag_type(str(f.type))
            # Numbers are checked as they are parsed, by the field's own rule (prompt_r1.core.checks):
            # `--env-timeout nan` is refused naming the flag, before any file is read.
            check = {"integer": kind is int, **f.metadata.get("check", {})}
            parse = flag_number(**check) if kind in (int, float) else kind
            metavar = {
                int: "N",
                float: "X",
                str: "URL" if f.name == "base_url" else f.name.split("_")[-1].upper(),
            }.get(kind)
            if kind is None:
                group.add_argument(
                    flag, dest=dest, action=argparse.BooleanOptionalAction, default=None, help=help_text
                )
            elif section == "environment" and f.name in repeatable_env:
                help_text += "; repeat it to sweep over environments, in the same order as --env-model"
                group.add_argument(
                    flag,
                    dest=dest,
                    type=parse,
                    action="append",
                    default=None,
                    metavar=metavar,
                    help=help_text,
                )
            else:
                group.add_argument(flag, dest=dest, type=parse, default=None, metavar=metavar, help=help_text)


def add_deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """`old`, a former name of the flag `new` (already added to `parser`): it still sets `new`'s value, checked by
    `new`'s own rule, and prints a one-line notice naming `new` each time it is used. Kept for one release."""
    current = next(action for action in parser._actions if new in action.option_strings)

    class Alias(argparse.Action):
        def __call__(self, parser, namespace, values, option_string=None) -> None:
            print(f"prompt-r1: warning: {old} is deprecated, use {new}", file=sys.stderr, flush=True)
            setattr(namespace, self.dest, values)

    parser.add_argument(
        old,
        dest=current.dest,
        type=current.type,
        action=Alias,
        metavar=current.metavar,
        help=f"deprecated name of {new}",
    )


def add_stop_flags(parser: argparse.ArgumentParser, unit: str) -> None:
    """--max-failures, --budget and --prices: the stop rules of a run over many `unit` (episodes, rows)."""
    parser.add_argument(
        "--max-failures",
        type=flag_number(integer=True, minimum=1),
        metavar="N",
        help=f"stop the run once N {unit} have failed (environment_error, agent_error, internal_error)",
    )
    parser.add_argument(
        "--budget",
        type=flag_number(above=0),
        metavar="USD",
        help=f"stop starting {unit} once the estimated cost of this run reaches USD",
    )
    parser.add_argument(
        "--prices",
        metavar="FILE",
        help="price table, $ per 1M tokens per model (YAML/JSON); its entries replace the bundled "
        "prompt_r1/clients/prices.yaml",
    )


# What `--ray` alone stores: this very object, told apart by identity from any ADDRESS typed (an argv string is
# never it), so that `--ray ''` (an empty address, a shell variable left unset) is refused rather than taken
# for "start a local Ray".
LOCAL_RAY = "--ray without ADDRESS"


def add_ray_flags(parser: argparse.ArgumentParser, unit: str) -> None:
    """--ray [ADDRESS], --ray-actors, --ray-actor-cpus, --ray-actor-gpus: run the `unit` in Ray actors."""
    parser.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL_RAY,
        metavar="ADDRESS",
        help=f"run the {unit} in Ray actors: without ADDRESS on a local Ray started for the run, else on the "
        "cluster at auto, ray://HOST:PORT or HOST:PORT (needs --env-rate-store redis://… every node reaches; one "
        f"where no Ray answers within {CONNECT_SECONDS:g} s is refused, exit 3). One provider limit, one --budget, one results file "
        "written here (the `ray` extra)",
    )
    parser.add_argument(
        "--ray-actors",
        type=flag_number(integer=True, minimum=1),
        default=2,
        metavar="N",
        help="Ray actors, each holding one agent and one environment client (default: 2); --concurrency is "
        "shared among them",
    )
    parser.add_argument(
        "--ray-actor-cpus",
        type=flag_number(minimum=0),
        default=1.0,
        metavar="N",
        help="CPUs per actor (default: 1)",
    )
    parser.add_argument(
        "--ray-actor-gpus",
        type=flag_number(minimum=0),
        default=0.0,
        metavar="N",
        help="GPUs per actor (default: 0; 1 for an agent model loaded on a GPU in each actor)",
    )


def ray_settings_from(args: argparse.Namespace):
    """The run's `RaySettings`, or None without --ray."""
    if args.ray is None:
        return None
    from prompt_r1.runs.ray_settings import RaySettings

    if args.ray is LOCAL_RAY:
        address = None
    elif not args.ray.strip():
        raise ConfigError(
            f"--ray {args.ray!r} names no cluster: give --ray alone to start a local Ray for the run, or --ray "
            "auto, ray://HOST:PORT or HOST:PORT"
        )
    else:
        address = args.ray
    return RaySettings(
        address,
        actors=args.ray_actors,
        actor_cpus=args.ray_actor_cpus,
        actor_gpus=args.ray_actor_gpus,
        flags=True,
    )


def check_ray_players(ray_settings, agent_cfg: AgentConfig | None, env_cfg: EnvironmentConfig | None) -> None:
    """What a --ray run checks here before Ray starts (its actors load the players, not this process): Ray is
    installed, a cluster has a shared store, the environment's key, the endpoints and the store answer."""
    from prompt_r1.clients.environment import OPENAI_BASE_URL, EnvironmentClient
    from prompt_r1.core.errors import BackendUnavailable
    from prompt_r1.runs.ray_batch import check_store_for, import_ray, unreachable_line, why_unreachable

    try:
        import_ray()
    except BackendUnavailable as exc:
        raise CommandFailure(str(exc), EXIT_USAGE) from None
    if env_cfg is not None and not ray_settings.local and not is_shared_store(env_cfg.rate_store):
        raise ConfigError(check_store_for(ray_settings))
    if ray_settings.address is not None:
        reason = why_unreachable(ray_settings.address)
        if reason is not None:
            raise CommandFailure(unreachable_line(ray_settings.address, reason), EXIT_UNREACHABLE)
    if env_cfg is not None:
        EnvironmentClient(env_cfg)  # a missing key is refused here, before Ray starts
        check_reachable(env_cfg.base_url or OPENAI_BASE_URL, "environment", "--env-base-url")
        check_rate_store(env_cfg.rate_store)
    if agent_cfg is not None and agent_cfg.resolved_backend == "served":
        check_reachable(agent_cfg.base_url, "served agent", "--agent-base-url")


@contextlib.contextmanager
def ray_failures():
    """A --ray run's own failures as the CLI's: the cluster unreachable exits 3, Ray missing or refused exits 2."""
    from prompt_r1.core.errors import BackendUnavailable
    from prompt_r1.runs.ray_batch import ClusterUnreachable

    try:
        yield
    except ClusterUnreachable as exc:
        raise CommandFailure(str(exc), EXIT_UNREACHABLE) from None
    except BackendUnavailable as exc:
        raise CommandFailure(str(exc), EXIT_USAGE) from None


def check_run_flags(args: argparse.Namespace) -> None:
    """--concurrency, --limit and the stop flags of a run over many items, checked before anything is read."""
    from prompt_r1.runs.pool import check_limits

    check_limits(args.concurrency, args.max_failures, args.budget, flags=True)
    number(args.limit, "--limit", integer=True, minimum=1, none_ok=True)


def configs_from_args(args: argparse.Namespace) -> tuple[AgentConfig, EnvironmentConfig, LoopConfig]:
    """The typed configs from --config and the flags; where no environment was named and its key is not set, the
    built-in model in place of the paper's defaults, with one line on stderr saying so (core/defaults.py)."""
    values: dict[str, dict[str, Any]] = load_config_file(args.config) if args.config else {}
    built, named = [], set()
    for section, cls, _ in _SECTIONS:
        merged = dict(values.get(section, {}))
        for f in fields(cls):
            flag_value = getattr(args, f"{section}__{f.name}", None)
            # A repeated flag (eval's sweep): the first value is the base settings'.
            if isinstance(flag_value, list):
                flag_value = flag_value[0]
            if flag_value is not None:
                merged[f.name] = flag_value
        named.update(f"{section}.{name}" for name in merged)
        try:
            built.append(cls(**merged))
        except TypeError as exc:
            raise ConfigError(f"bad {section} settings: {exc}") from exc
    from prompt_r1.core.defaults import offline_default

    agent, environment, why = offline_default(built[0], built[1], named=named)
    if why is not None:
        print(f"prompt-r1: {why}", file=sys.stderr, flush=True)
    return agent, environment, built[2]


def check_reachable(url: str, what: str, flag: str, timeout: float = 5.0) -> None:
    """Fail fast, with one line, when nothing listens at `url` (before loading models or paying for calls)."""
    reason = unreachable_reason(url, timeout)
    if reason is not None:
        raise CommandFailure(
            f"cannot reach the {what} at {printable_url(url, 200)} ({reason}); start it or point {flag} at an OpenAI-compatible server",
            EXIT_UNREACHABLE,
        )


def check_rate_store(url: str) -> None:
    """Fail fast, with one line and nothing sent to any provider, when a shared rate store does not answer."""
    if not is_shared_store(url):
        return
    from prompt_r1.clients.limit_store import check_store, store_label
    from prompt_r1.core.config import RATE_STORE_PASSWORD_ENV, rate_store_password

    reason = check_store(url, rate_store_password(url))
    if reason is not None:
        raise CommandFailure(
            f"cannot reach the rate store at {store_label(url)} ({reason}); start it, set "
            f"{RATE_STORE_PASSWORD_ENV} if it wants a password, or use --env-rate-store {MEMORY_STORE}",
            EXIT_UNREACHABLE,
        )


def check_model(name: str, flag: str) -> None:
    """Check, in seconds and before anything loads it, the model `flag` names (agents/model_source.py), with
    every command's exit codes: a `CommandFailure` with exit 2 for the user's to fix (a mistyped name, an empty
    folder, a package to install: `ModelNameError`), with exit 3 for a model that cannot be had here (the hub
    unreachable)."""
    from prompt_r1.agents.builtin import ModelNameError
    from prompt_r1.agents.model_source import check_model_source

    try:
        check_model_source(name, flag)
    except ModelNameError as exc:  # a name to fix, a folder with no model in it, or a package to install
        raise CommandFailure(str(exc), EXIT_USAGE) from None
    except ConfigError as exc:  # a hub that cannot be reached
        raise CommandFailure(str(exc), EXIT_UNREACHABLE) from None


def build_players(agent_cfg: AgentConfig | None, env_cfg: EnvironmentConfig | None):
    """The run's (agent, environment client) from its configs (a config None: that player is not needed, and
    None comes back in its place), cheapest checks first: keys, sockets, then model loading. An unreachable
    endpoint or model is a `CommandFailure` with exit code 3."""
    from prompt_r1.agents import load_agent
    from prompt_r1.agents.builtin import ModelNameError, is_builtin
    from prompt_r1.clients.environment import OPENAI_BASE_URL, EnvironmentClient

    environment = agent = None
    builtin_env = env_cfg is not None and is_builtin(env_cfg.model) and env_cfg.base_url is None
    if env_cfg is not None and not builtin_env:
        environment = EnvironmentClient(env_cfg)  # raises MissingCredentials before anything expensive
        check_reachable(env_cfg.base_url or OPENAI_BASE_URL, "environment", "--env-base-url")
        check_rate_store(env_cfg.rate_store)
    if agent_cfg is not None and agent_cfg.resolved_backend != "served":
        check_model(agent_cfg.model, "--agent-model")  # built in, a folder or a hub id, in seconds
    if builtin_env:
        # Served on 127.0.0.1 by this process (agents/model_server.py) for as long as the command runs.
        from prompt_r1.agents.model_server import local_environment

        check_model(env_cfg.model, "--env-model")
        check_rate_store(env_cfg.rate_store)
        environment = EnvironmentClient(local_environment(env_cfg))
    if agent_cfg is not None:
        if agent_cfg.resolved_backend == "served":
            check_reachable(agent_cfg.base_url, "served agent", "--agent-base-url")
        try:
            agent = load_agent(agent_cfg)
        except ModelNameError as exc:  # e.g. a .gguf file that holds no model
            raise CommandFailure(str(exc), EXIT_USAGE) from exc
        except ConfigError as exc:
            raise CommandFailure(str(exc), EXIT_UNREACHABLE) from exc
    return agent, environment
