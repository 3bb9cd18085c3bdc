"""The project's error hierarchy and the one predicate that decides what is retried.

    PromptR1Error
    ├── ConfigError (also a ValueError)          bad settings; the message says how to fix them
    │   ├── MissingCredentials                   an API key variable is unset
    │   ├── DataError                            a dataset file or row that cannot be used; names the row
    │   └── OutputError                          an output file that cannot be written, or is not ours to write
    ├── BackendUnavailable (also ImportError)    an optional extra (vllm, trl, ...) is not installed
    ├── AgentError                               the agent backend failed
    │   └── AgentRefused                         a served agent's provider refused (content filter): final
    ├── ContextOverflow                          a prompt no longer fits a model's context or token budget
    └── EnvironmentCallError                     a call to the large LLM failed
        ├── RateLimited         (retryable)     HTTP 429; carries the server's Retry-After
        ├── EnvironmentTimeout  (retryable)     no answer within the per-call timeout
        ├── EnvironmentUnreachable (retryable)  connection refused, reset or dropped
        ├── EnvironmentServerError (retryable)  HTTP 5xx, or a 200 whose body is not a chat completion
        ├── EnvironmentRejected (final)         any other 4xx: bad request, auth, unknown model
        └── EnvironmentRefused (final)          a content filter or refusal: the same prompt is refused again

Only `is_retryable` decides what the retry layer retries, so the rule lives in one place.

`RequestError` is the other side of the wire: a request one of the project's own servers refuses (the OpenAI-
compatible server of `prompt_r1.integrations.server`, the built-in model's server), with the HTTP status and
OpenAI's error fields its reply carries.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AgentError",
    "AgentRefused",
    "BackendUnavailable",
    "ConfigError",
    "ContextOverflow",
    "DataError",
    "EnvironmentCallError",
    "EnvironmentRefused",
    "EnvironmentRejected",
    "EnvironmentServerError",
    "EnvironmentTimeout",
    "EnvironmentUnreachable",
    "MissingCredentials",
    "OutputError",
    "PromptR1Error",
    "RateLimited",
    "RateStoreUnreachable",
    "RequestError",
    "is_retryable",
]


class PromptR1Error(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(PromptR1Error, ValueError):
    """Settings that cannot work; the message names the setting and the fix."""


class MissingCredentials(ConfigError):
    """An API key is needed and the environment variable that should hold it is unset."""


class DataError(ConfigError):
    """A dataset that cannot be loaded as asked: unknown name, unreadable file, or a malformed row (named)."""


class OutputError(ConfigError):
    """An output path that cannot be written (a folder, a read-only or full file system) or that holds a file this
    project did not write (the input, another file): refused before anything is written to it; names the path."""


class RateStoreUnreachable(ConfigError):
    """A shared rate store that has not answered once since this process started: nothing is sent to the provider
    until it does, since this process cannot know how much of the limit the others use."""


class BackendUnavailable(PromptR1Error, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


class AgentError(PromptR1Error):
    """The agent backend failed to produce a generation."""


class AgentRefused(AgentError):
    """A served agent's provider refused the request (content filter, refusal): an outcome of the episode (status
    `refused`), not a failure a rerun should pay for again."""


class ContextOverflow(PromptR1Error):
    """The conversation no longer fits the model's context window or the episode's token budget."""


class EnvironmentCallError(PromptR1Error):
    """A call to the environment (the large LLM) failed."""

    retryable: bool = False

    def __init__(
        self, message: str, *, status_code: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.retry_after = retry_after  # the server's Retry-After in seconds, when it sent one
        self.attempts = 1  # set by the retry layer when the call finally fails


class RateLimited(EnvironmentCallError):
    """HTTP 429. `retry_after` is the server's Retry-After in seconds, when it sent one."""

    retryable = True

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message, status_code=429, retry_after=retry_after)


class EnvironmentTimeout(EnvironmentCallError):
    retryable = True


class EnvironmentUnreachable(EnvironmentCallError):
    retryable = True


class EnvironmentServerError(EnvironmentCallError):
    retryable = True


class EnvironmentRejected(EnvironmentCallError):
    """A 4xx other than 429: retrying the same request cannot succeed."""


class EnvironmentRefused(EnvironmentCallError):
    """The provider's content filter, or the model, refused the prompt: an outcome of the episode (status
    `refused`), not a fault to retry, so a rerun does not pay for the same refusal again."""


def is_retryable(exc: BaseException) -> bool:
    """True for failures a later identical request may not repeat (429, 5xx, timeouts, dropped connections).

    >>> is_retryable(RateLimited("slow down", retry_after=1.0))
    True
    >>> is_retryable(EnvironmentRejected("bad request", status_code=400))
    False
    """
    return isinstance(exc, EnvironmentCallError) and exc.retryable


class RequestError(Exception):
    """A request a server of this project refuses: its HTTP status and OpenAI-style error fields (`kind` is the
    error's `type`: a client's mistake below 500, the server's own from 500)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str | None = None, headers: dict[str, str] | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.param, self.code, self.headers = status, param, code, headers or {}
        self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}
