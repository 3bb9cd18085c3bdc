"""API keys never leave the process: one place that knows every key in use and cuts it out of what is written.

A server, or a proxy in front of it, may repeat a request's `Authorization` header in an error body (a 401 that
echoes what it was sent is common). Error text then travels into result rows, checkpoints, HTTP responses,
progress bars, logs and tracebacks. Rather than trusting each surface to remember, every key the project sends is
registered here when it is read (`register`, called by `config.resolve_api_key` and by the clients that are handed
a key directly), and each surface writes through `redact`:

    from prompt_r1.core import redaction
    redaction.register("sk-live-…")                      # done for you when a client reads its key
    redaction.redact("401: bad key sk-live-…")           # '401: bad key ***'
    redaction.json_line({"error": "… sk-live-…"})        # one JSON line, the key cut also where JSON-escaped

`RedactedStream` wraps stdout/stderr (the CLI wraps both for the whole command); `RedactingFilter` guards logging
handlers. Values shorter than 8 characters (placeholders such as `dummy` for a local server) and the no-key placeholder are not secrets and are left alone, so that
redaction never mangles ordinary text.

Secrets that were never registered are cut by their shape (`mask_secrets`, applied by every `Redactor`): a URL's
user part (`http://user:pw@host` → `http://***@host`) and the value of a query parameter whose name says it is a
secret (`?api_key=…`, `&token=…`, `&sig=…`). A command line is cut by `mask_command_line`, which also masks the
value of a flag so named (`--hub_token hf_…`). One function for every file the product writes: outputs,
manifests, summaries, caches, logs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import threading
from collections.abc import Iterable
from typing import Any, TextIO
from urllib.parse import unquote

__all__ = [
    "MASK",
    "NO_KEY",
    "RedactedStream",
    "RedactingFilter",
    "Redactor",
    "dumps",
    "is_secret_name",
    "json_line",
    "mask_command_line",
    "mask_secrets",
    "protect_loggers",
    "protect_logging",
    "redact",
    "redact_exception",
    "register",
    "register_from",
    "registered",
    "scrub",
]

MASK = "***"
NO_KEY = "EMPTY"  # what local OpenAI-compatible servers (vLLM, llama.cpp) accept when they need no key
_MIN_LENGTH = 8  # shorter "keys" (dummy, test, none) are placeholders for local servers, not secrets
_lock = threading.Lock()
_registered: set[str] = set()


def _is_secret(value: str | None) -> bool:
    return bool(value) and len(value) >= _MIN_LENGTH and value != NO_KEY


# The last word of a query parameter's, flag's or variable's name that says its value is a secret: api_key,
# x-api-key, access_token, hub_token and client_secret are; max_tokens, token_limit and api_key_env are not.
SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "accesstoken", "authtoken", "password", "passwd", "pwd", "secret", "sig",
     "signature", "credential", "credentials", "auth", "authorization"}
)  # fmt: skip
# scheme://USER:PASSWORD@ up to the last @ before the host ends (a password may hold an unencoded @).
_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#\s\"'<>\\]*@")
# ?name=value, &name=value or ;name=value, up to the next separator, quote or space.
_QUERY = re.compile(r"([?&;])([^=&#?\s\"'<>]{1,100})=([^&#\s\"'<>]*)")


def is_secret_name(name: str) -> bool:
    """Whether a query parameter, flag or variable of this name holds a secret, by its last word.

    >>> [is_secret_name(n) for n in ("api_key", "--hub-token", "X-Api-Key", "max_tokens", "api_key_env")]
    [True, True, True, False, False]
    """
    words = [w for w in re.split(r"[-_.\s]+", unquote(name).strip().lower()) if w]
    return bool(words) and words[-1] in SECRET_WORDS


def _masked_query(match: re.Match[str]) -> str:
    separator, name, value = match.groups()
    return f"{separator}{name}={MASK}" if value and is_secret_name(name) else match.group(0)


def mask_secrets(text: str) -> str:
    """`text` with every URL's user part and every secret-named query parameter's value masked.

    >>> mask_secrets("see http://bob:pw@10.0.0.5:8000/v1?api_key=k1&model=m and &token=t2")
    'see http://***@10.0.0.5:8000/v1?api_key=***&model=m and &token=***'
    """
    if "://" in text:
        text = _USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
    if "=" in text:
        text = _QUERY.sub(_masked_query, text)
    return text


def mask_command_line(argv: Iterable[str]) -> list[str]:
    """A command line as it may be written down: each argument through `mask_secrets`, and the value of every
    secret-named flag (`--hub_token hf_…`, `--api-key=…`) masked.

    >>> mask_command_line(["train", "--hub_token", "hf_x", "--api-key=k", "--max-tokens", "9"])
    ['train', '--hub_token', '***', '--api-key=***', '--max-tokens', '9']
    """
    masked: list[str] = []
    hide_next = False
    for arg in map(str, argv):
        name, equals, _ = arg.partition("=")
        if hide_next and not arg.startswith("-"):
            masked.append(MASK)
        elif arg.startswith("-") and equals and is_secret_name(name.lstrip("-")):
            masked.append(f"{name}={MASK}")
        else:
            masked.append(mask_secrets(arg))
        hide_next = arg.startswith("-") and not equals and is_secret_name(arg.lstrip("-"))
    return masked


def register(*secrets: str | None) -> None:
    """Add keys to the process-wide set that every surface cuts out of what it writes."""
    with _lock:
        _registered.update(s for s in secrets if isinstance(s, str) and _is_secret(s))


def registered() -> frozenset[str]:
    return frozenset(_registered)


class Redactor:
    """Cuts secrets out of text: the process-wide registered keys plus `extra` ones."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        self.extra = frozenset(s for s in extra if isinstance(s, str) and _is_secret(s))
        self._cache: tuple[frozenset[str], list[str], list[str]] | None = None

    @property
    def secrets(self) -> list[str]:
        return self._forms()[0]

    def _forms(self) -> tuple[list[str], list[str]]:
        current = self.extra | _registered
        if self._cache is None or self._cache[0] != current:
            # Longest first, so a key that contains another is cut whole.
            plain = sorted(current, key=len, reverse=True)
            # In JSON a secret may appear escaped (quotes, backslashes, control characters, non-ASCII).
            escaped = set()
            for s in plain:
                for ascii_only in (False, True):
                    form = json.dumps(s, ensure_ascii=ascii_only)[1:-1]
                    if form != s:
                        escaped.add(form)
            self._cache = (current, plain, sorted(escaped, key=len, reverse=True))
        return self._cache[1], self._cache[2]

    def __call__(self, text: str | None) -> str | None:
        if not text:
            return text
        plain, escaped = self._forms()
        for secret in (*plain, *escaped):
            if secret in text:
                text = text.replace(secret, MASK)
        return mask_secrets(text)

    def exception(self, exc: BaseException) -> BaseException:
        """`exc` with the secrets cut out of its message, in place (its type and attributes stay), and out of every
        exception a traceback of it would print: its causes, its contexts (both, not only the one a traceback
        follows first), the members of an exception group, and their notes."""
        if not self.secrets:
            return exc
        seen: set[int] = set()
        pending: list[BaseException] = [exc]
        while pending:
            current = pending.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            args = tuple(self.scrub(a) for a in current.args)
            if args != current.args:
                current.args = args
            for name in ("message", "body"):  # openai's errors keep the text again in attributes (body: JSON)
                value = getattr(current, name, None)
                if isinstance(value, str | dict | list) and self.scrub(value) != value:
                    with contextlib.suppress(AttributeError):
                        setattr(current, name, self.scrub(value))
            notes = getattr(current, "__notes__", None)
            if isinstance(notes, list):
                current.__notes__ = [self.scrub(n) for n in notes]
            pending += [e for e in (current.__cause__, current.__context__) if e is not None]
            pending += list(getattr(current, "exceptions", None) or ())  # an ExceptionGroup's members
        return exc

    def scrub(self, value: Any) -> Any:
        """`value` with the secrets cut from its text: a string, or the strings inside JSON-like lists and dicts
        (keys too); anything else is returned as it is."""
        if isinstance(value, str):
            return self(value)
        if isinstance(value, dict):
            return {self.scrub(k): self.scrub(v) for k, v in value.items()}
        if type(value) in (list, tuple):  # exactly: a named tuple or a list subclass is left as it is
            return type(value)(self.scrub(v) for v in value)
        return value

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        """`json.dumps(obj)` (non-ASCII kept) with the secrets cut, also in their JSON-escaped forms; text that is
        not valid UTF-8 (a lone surrogate) is written as U+FFFD so that the result always encodes."""
        from prompt_r1.core.text import repair

        kwargs.setdefault("ensure_ascii", False)
        text, _ = repair(json.dumps(obj, **kwargs))
        return self(text)

    def json_line(self, row: Any) -> str:
        return self.dumps(row) + "\n"


_default = Redactor()


def redact(text: str | None) -> str | None:
    """`text` with every registered key replaced by ***."""
    return _default(text)


def redact_exception(exc: BaseException) -> BaseException:
    """`exc` and every exception a traceback of it prints, with every registered key cut, in place."""
    return _default.exception(exc)


def scrub(value: Any) -> Any:
    """`value` (text, or JSON-like lists and dicts of it) with every registered key and URL secret cut."""
    return _default.scrub(value)


def register_from(model: Any) -> None:
    """Register every secret a pydantic model holds (`SecretStr` fields: a `ChatOpenAI`'s api_key, whether given
    as `api_key=` or read from OPENAI_API_KEY, or any other chat model's), for a model handed in ready-made."""
    fields = getattr(type(model), "model_fields", None) or {}
    for name in fields:
        value = getattr(model, name, None)
        reveal = getattr(value, "get_secret_value", None)
        if callable(reveal):
            secret = reveal()
            register(secret if isinstance(secret, str) else None)


def json_line(row: Any) -> str:
    """One JSON line for a results file, with every registered key cut."""
    return _default.json_line(row)


def dumps(obj: Any, **kwargs: Any) -> str:
    """`json.dumps` for anything sent or written (HTTP bodies, reports): registered keys cut, always encodable."""
    return _default.dumps(obj, **kwargs)


class RedactedStream:
    """A text stream (stdout, stderr, a progress bar's) that passes everything written through a `Redactor`."""

    def __init__(self, inner: TextIO, redactor: Redactor | None = None) -> None:
        self.inner, self.redactor = inner, redactor or _default

    def write(self, text: str) -> int:
        from prompt_r1.core.text import repair

        # Repaired too: a lone surrogate (in an error a server sent, say) must not crash the write.
        self.inner.write(repair(self.redactor(text))[0])
        return len(text)  # what the caller handed over, as a stream reports it

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class RedactingFilter(logging.Filter):
    """A logging filter that formats each record's message and cuts the secrets out of it (and out of the
    exception text a handler would print)."""

    def __init__(self, redactor: Redactor | None = None) -> None:
        super().__init__()
        self.redactor = redactor or _default

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (
            Exception
        ):  # a record whose args do not fit its format: leave it to the handler's own error path
            return True
        cleaned = self.redactor(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            self.redactor.exception(record.exc_info[1])
            record.exc_text = None
        return True


def protect_loggers(*names: str) -> None:
    """Guard the named loggers themselves with a `RedactingFilter`, whatever handlers an application gives them
    later: for libraries that log what a server sent (httpcore logs response headers at DEBUG). A logger's filter
    sees only the records logged on it, so each logger that writes such records is named. Safe to call again."""
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RedactingFilter) for f in logger.filters):
            logger.addFilter(RedactingFilter())


def protect_logging(*extra_handlers: logging.Handler) -> None:
    """Guard the root logger's handlers, Python's last-resort handler (what prints a warning when no handler is
    configured) and `extra_handlers` with a `RedactingFilter`. Safe to call again."""
    handlers = [*logging.getLogger().handlers, *extra_handlers]
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())
