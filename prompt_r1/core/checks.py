"""The one check of every number a user gives: a flag, a key of a YAML/JSON file, an environment variable, a field
of an HTTP request body or a keyword of the Python API.

    number(args.budget, "--budget", above=0)           # a ConfigError naming --budget for nan, inf, -1 or "x"
    parser.add_argument("--budget", type=flag_number(above=0))   # the same rule, refused by argparse (exit 2)

A number must be a real int or float (never a bool, which Python counts as an int, nor text), finite (nan compares
unequal to itself, so a setting holding it never matches its own record and silently passes every `< 0` test;
inf means "no limit" only where a field says so with `infinite_ok`), an integer where the field counts things,
and inside the field's range. Nothing heavy is imported here: the config dataclasses, the CLI and the server all
call it before anything is loaded or contacted.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from prompt_r1.core.errors import ConfigError

__all__ = ["describe_range", "flag_number", "number", "parse_number"]


def describe_range(
    *,
    integer: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
) -> str:
    """What a field accepts, in words: "an integer ≥ 1", "a number > 0 and ≤ 2".

    >>> describe_range(integer=True, minimum=1)
    'an integer ≥ 1'
    >>> describe_range(minimum=0, maximum=2)
    'a finite number ≥ 0 and ≤ 2'
    """
    bounds = [f"{sign} {_show(value)}" for sign, value in
              (("≥", minimum), (">", above), ("≤", maximum), ("<", below)) if value is not None]  # fmt: skip
    kind = "an integer" if integer else "a finite number"
    return kind + (" " + " and ".join(bounds) if bounds else "")


def _show(value: float) -> str:
    return str(int(value)) if float(value).is_integer() and abs(value) < 1e15 else str(value)


def number(
    value: Any,
    name: str,
    *,
    integer: bool = False,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    below: float | None = None,
    none_ok: bool = False,
    infinite_ok: bool = False,
    error: type[Exception] = ConfigError,
) -> Any:
    """`value` when it is a number in range, else `error` (a ConfigError) naming `name` and what it accepts.

    `minimum`/`maximum` are inclusive bounds, `above`/`below` exclusive ones; `none_ok`: None means "unset";
    `infinite_ok`: +inf is allowed (as "no limit"), -inf and nan never are. An integral float (3.0, from a YAML
    file or JSON body) is accepted for an integer field and returned as an int.

    >>> number(3, "--limit", integer=True, minimum=1)
    3
    >>> number(float("nan"), "--budget", above=0)
    Traceback (most recent call last):
    ...
    prompt_r1.core.errors.ConfigError: --budget must be a finite number > 0, got nan
    """
    wanted = describe_range(integer=integer, minimum=minimum, maximum=maximum, above=above, below=below)
    if value is None:
        if none_ok:
            return None
        raise error(f"{name} must be {wanted}, got nothing")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise error(f"{name} must be {wanted}, got {value!r}")
    if isinstance(value, float):
        if math.isnan(value) or (math.isinf(value) and not (infinite_ok and value > 0)):
            raise error(f"{name} must be {wanted}, got {value}")
        if integer:
            if not value.is_integer():
                raise error(f"{name} must be {wanted}, got {value}")
            value = int(value)
    if (
        (minimum is not None and value < minimum)
        or (maximum is not None and value > maximum)
        or (above is not None and value <= above)
        or (below is not None and value >= below)
    ):
        raise error(f"{name} must be {wanted}, got {value}")
    return value


def parse_number(text: str, name: str, *, integer: bool = False, **bounds: Any) -> Any:
    """`number` of the text of a flag or environment variable: "nan", "inf", "1e3" and "x" are read as Python
    reads them, then checked; an integer field takes only integer text ("3", not "3.0")."""
    try:
        value = int(text) if integer else float(text)
    except (TypeError, ValueError):
        wanted = describe_range(integer=integer, **{k: v for k, v in bounds.items() if k in _BOUNDS})
        raise ConfigError(f"{name} must be {wanted}, got {text!r}") from None
    return number(value, name, integer=integer, **bounds)


_BOUNDS = ("minimum", "maximum", "above", "below")


def flag_number(*, integer: bool = False, **bounds: Any) -> Callable[[str], Any]:
    """An argparse `type=` that applies `number`: argparse then refuses a bad value with its usage line and
    exit 2, naming the flag ("argument --budget: must be a finite number > 0, got nan")."""

    def convert(text: str) -> Any:
        try:
            return parse_number(text, "it", integer=integer, **bounds)
        except ConfigError as exc:
            # argparse prefixes "argument --flag: "; "it must be" reads as "must be" after it.
            raise argparse.ArgumentTypeError(str(exc).removeprefix("it ")) from None

    convert.__name__ = "integer" if integer else "number"  # what argparse names in "invalid integer value"
    return convert
