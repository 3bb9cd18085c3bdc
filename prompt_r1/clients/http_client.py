"""The HTTP layer under every OpenAI-compatible call (environment and served agent): it checks each 200, and
`classify_error` says what any failure of a call means in the project's error hierarchy (errors.py).

A server in trouble does not always say so with a status code: a proxy answers 200 with an HTML error page, a
gateway truncates a body into invalid UTF-8, an overloaded provider sends `200 {"error": {...}}`, a router
returns `choices: []`. Left to the SDK these surface as a `ValueError` or `IndexError` deep in a chat model,
which nothing can tell from a bug, so they were never retried. The response hook here reads each chat-completions
200 before the SDK does and raises:

- `MalformedResponse` (an `openai.APIResponseValidationError`, which the retry layer treats as a transient
  server fault) for a body that is not valid UTF-8, not JSON, not an object, has no choices, or carries an error
  object that says the server failed;
- `ResponseRefused` (final: the same request would be refused again) for a content filter or a refusal, either
  as `finish_reason: "content_filter"`, a `refusal` in place of content, or an error object saying so.

    client = checked_async_client(timeout=60)
    ChatOpenAI(..., http_async_client=client)
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
from langchain_core.exceptions import (
    ContextOverflowError,
    ModelAPIError,
    ModelAuthenticationError,
    ModelConnectionError,
    ModelRateLimitError,
    ModelTimeoutError,
)
from langchain_core.messages import AIMessage

from prompt_r1.clients.http_pool import speed_up
from prompt_r1.clients.openai_transform import speed_up_transform
from prompt_r1.clients.shared_limit import parse_reset
from prompt_r1.core import redaction
from prompt_r1.core.errors import (
    ContextOverflow,
    EnvironmentCallError,
    EnvironmentRefused,
    EnvironmentRejected,
    EnvironmentServerError,
    EnvironmentTimeout,
    EnvironmentUnreachable,
    RateLimited,
)

__all__ = [
    "MalformedResponse",
    "ResponseRefused",
    "check_completion_body",
    "checked_async_client",
    "copy_for_this_loop",
    "classify_error",
    "refusal_of",
]

# Read in an error object's `type` and `code` only: a message is free text ("connection refused, retry").
_REFUSAL_WORDS = ("content_filter", "content_policy", "refusal", "safety")
_SNIPPET = 200
# The loggers of the HTTP stack that write what a server sent (headers, status lines, error bodies).
_HTTP_LOGGERS = (
    "httpx",
    "httpcore.connection",
    "httpcore.http11",
    "httpcore.http2",
    "httpcore.proxy",
    "openai._base_client",
)


class MalformedResponse(openai.APIResponseValidationError):
    """A 200 whose body is not a usable chat completion: a server fault that a retry usually clears."""

    def __init__(self, response: httpx.Response, message: str) -> None:
        super().__init__(response, None, message=message)


class ResponseRefused(openai.OpenAIError):
    """The model or its provider refused the prompt (content filter, refusal). Retrying it would be refused again."""


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _SNIPPET else text[:_SNIPPET] + "…"


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        parts = [str(error.get(k)) for k in ("type", "code", "message") if error.get(k)]
        return ": ".join(parts) or json.dumps(error)[:_SNIPPET]
    return str(error)


def _is_refusal(error: Any) -> bool:
    """An error object whose `type` or `code` names a content filter or refusal."""
    if not isinstance(error, dict):
        return False
    label = f"{error.get('type') or ''} {error.get('code') or ''}".lower()
    return any(word in label for word in _REFUSAL_WORDS)


def check_completion_body(raw: bytes, content_type: str = "") -> tuple[str, str] | None:
    """None for a usable chat completion, else (kind, reason) with kind "malformed" or "refused"."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "malformed", f"the body is not valid UTF-8 (byte {exc.start})"
    try:
        body = json.loads(text)
    except (ValueError, RecursionError):
        kind = content_type.split(";")[0].strip() or "no content type"
        return "malformed", f"the body is not JSON ({kind}): {_snippet(text)!r}"
    if not isinstance(body, dict):
        return "malformed", f"the body is a JSON {type(body).__name__}, not an object"
    error = body.get("error")
    if error:
        reason = _error_text(error)
        if _is_refusal(error):
            return "refused", f"the provider refused the prompt ({reason})"
        return "malformed", f"the server answered 200 with an error: {reason}"
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return "malformed", "the response has no choices"
    choice = choices[0]
    if choice.get("finish_reason") == "content_filter":
        return "refused", "the provider's content filter withheld the reply (finish_reason content_filter)"
    message = choice.get("message")
    if isinstance(message, dict) and message.get("refusal") and not message.get("content"):
        return "refused", f"the model refused: {_snippet(str(message['refusal']))!r}"
    return None


def _redact_body(response: httpx.Response) -> None:
    """Cut the keys out of a response body already read (as bytes: whatever it holds, only the keys change)."""
    raw = response.content
    text = raw.decode("utf-8", "surrogateescape")
    cleaned = redaction.redact(text)
    if cleaned != text:
        # httpx has no public way to replace a body already read; the SDK reads `content` after these hooks.
        response._content = cleaned.encode("utf-8", "surrogateescape")
        if "content-length" in response.headers:
            response.headers["content-length"] = str(len(response._content))


async def _redact_response(response: httpx.Response) -> None:
    """The first thing done with every response: the keys the project sends are cut out of its headers and, for an
    error, its body (a server or a gateway before it may repeat the request's Authorization header there), before
    the SDK builds an exception from them. So the exception, and every trace, log line or row that holds its text,
    never holds a key: not only where this project writes it, but also in the chat model's own run that a tracer
    records before the error reaches the project."""
    if not redaction.registered():
        return
    items = response.headers.multi_items()
    cleaned = [(name, redaction.redact(value)) for name, value in items]
    if cleaned != items:
        response.headers = httpx.Headers(cleaned)
    if response.status_code >= 400:
        await response.aread()
        _redact_body(response)


async def _check_response(response: httpx.Response) -> None:
    request = response.request
    if response.status_code != 200 or request.method != "POST":
        return
    if not request.url.path.endswith(("/chat/completions", "/completions")):
        return
    if "text/event-stream" in response.headers.get("content-type", ""):
        return  # a stream is checked chunk by chunk by the SDK
    await response.aread()
    problem = check_completion_body(response.content, response.headers.get("content-type", ""))
    if problem is None:
        return
    kind, reason = problem
    if kind == "refused":
        raise ResponseRefused(reason)
    raise MalformedResponse(response, f"malformed response from {request.url.host}: {reason}")


def checked_async_client(timeout: float | None, **kwargs: Any) -> httpx.AsyncClient:
    """An `httpx.AsyncClient` (no connection limit: the callers cap requests in flight themselves) that checks
    every chat-completions 200 as described above, and cuts the keys out of every response (`_redact_response`);
    its pool's bookkeeping is linear in the requests in flight (prompt_r1.clients.http_pool), and the SDK's
    chat-completions body transform is skipped where it would change nothing (prompt_r1.clients.openai_transform)."""
    # Idle connections kept as many as were in flight (for 5 s, httpx's keep-alive): a step's burst of calls
    # reuses the last burst's connections instead of opening all but 20 of them again.
    kwargs.setdefault("limits", httpx.Limits(max_connections=None, max_keepalive_connections=None))
    # httpcore logs each response's headers at DEBUG before any hook runs: its loggers cut the keys themselves.
    redaction.protect_loggers(*_HTTP_LOGGERS)
    hooks = {"response": [_redact_response, _check_response]}
    speed_up_transform()
    return speed_up(httpx.AsyncClient(timeout=timeout, event_hooks=hooks, **kwargs))


# A chat model's fields that hold HTTP clients: an async one belongs to the event loop that first used it.
_CLIENT_FIELDS = (
    "client",
    "async_client",
    "root_client",
    "root_async_client",
    "http_client",
    "http_async_client",
)


def copy_for_this_loop(model: Any, timeout: float | None) -> Any:
    """A copy of an OpenAI-client chat model (`ChatOpenAI`, `AzureChatOpenAI`: any with `http_async_client`) built
    from the same settings with an async HTTP client of its own, checked as above, for the running event loop.

    Such a model keeps one async connection pool, shared even across instances (langchain-openai caches it per
    base URL), which is bound to the loop that first used it: a process that calls it from two loops (a sync
    `invoke` on the background loop, then `asyncio.run(ainvoke(...))`) fails with "bound to a different event
    loop" or "Event loop is closed". Any other chat model is returned as it is."""
    if "http_async_client" not in type(model).model_fields:
        return model
    settings = {name: getattr(model, name) for name in model.model_fields_set if name not in _CLIENT_FIELDS}
    return type(model)(**settings, http_async_client=checked_async_client(timeout))


def _retry_after_seconds(headers) -> float | None:
    """Seconds from Retry-After (seconds form) or the retry-after-ms header some providers send, else from the
    provider's x-ratelimit-reset-requests / -tokens (the later of the two: both windows must have room)."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 1e-3), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) * scale)
        except ValueError:
            continue  # the HTTP-date form: fall back to backoff
    resets = [parse_reset(headers.get(f"x-ratelimit-reset-{kind}")) for kind in ("requests", "tokens")]
    resets = [r for r in resets if r is not None]
    return max(resets) if resets else None


def classify_error(exc: BaseException) -> BaseException:
    """Map an OpenAI/LangChain/asyncio failure to this package's error hierarchy (see errors.py), with every
    configured key cut out of the result and out of `exc` and its chain (which the caller raises it from).

    This is where an environment's failure crosses into the project, whatever chat model raised it: a model
    whose HTTP this module does not see (any other provider's) may still carry a server's echo of its key."""
    mapped = _classified(redaction.redact_exception(exc))
    return redaction.redact_exception(mapped)


def _classified(exc: BaseException) -> BaseException:
    if isinstance(exc, EnvironmentCallError | ContextOverflow):
        return exc
    cause = exc.__cause__
    if isinstance(exc, openai.APIConnectionError) and isinstance(cause, MalformedResponse | ResponseRefused):
        exc = cause  # an SDK that wraps what a response hook raises: the check's own verdict is what counts
    if isinstance(exc, ResponseRefused):
        return EnvironmentRefused(f"environment refused the prompt: {exc}")
    if isinstance(exc, ContextOverflowError):
        return ContextOverflow(f"environment context overflow: {exc}")
    if isinstance(exc, openai.RateLimitError | ModelRateLimitError):
        response = getattr(exc, "response", None)
        return RateLimited(
            f"rate limited (429): {exc}", retry_after=_retry_after_seconds(getattr(response, "headers", None))
        )
    if isinstance(exc, TimeoutError | openai.APITimeoutError | ModelTimeoutError):
        return EnvironmentTimeout("environment call timed out")
    if isinstance(exc, openai.APIConnectionError | ModelConnectionError):
        return EnvironmentUnreachable(f"connection to the environment failed: {exc}")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retry_after = _retry_after_seconds(getattr(exc.response, "headers", None))
        if status == 408:
            return EnvironmentTimeout(f"environment request timeout (408): {exc.message}", status_code=408)
        if status == 400 and _is_content_filter(getattr(exc, "body", None)):
            return EnvironmentRefused(f"environment refused the prompt (400): {exc.message}", status_code=400)
        if (
            status >= 500 or status == 409
        ):  # 409: a conflict (e.g. a lock) that clears, as the OpenAI SDK assumes
            return EnvironmentServerError(
                f"environment server error ({status}): {exc.message}",
                status_code=status,
                retry_after=retry_after,
            )
        return EnvironmentRejected(
            f"environment rejected the request ({status}): {exc.message}", status_code=status
        )
    if isinstance(exc, ModelAuthenticationError):
        return EnvironmentRejected(f"environment rejected the credentials: {exc}", status_code=401)
    if isinstance(exc, openai.APIResponseValidationError | json.JSONDecodeError | ModelAPIError):
        # A body that is not a chat completion is a server fault that a retry usually clears.
        return EnvironmentServerError(f"malformed environment response: {exc}")
    if isinstance(exc, openai.APIError):
        return EnvironmentServerError(f"environment API error: {exc}")
    # Anything else a chat model raises is a failure of the call, not of the loop: final, and reported as such.
    return EnvironmentCallError(f"environment call failed: {type(exc).__name__}: {exc}")


def _is_content_filter(body: object) -> bool:
    """A 400 that is a content filter's verdict on the prompt (Azure OpenAI's `code: content_filter`)."""
    error = body.get("error", body) if isinstance(body, dict) else None
    return isinstance(error, dict) and "content_filter" in str(error.get("code", "")) + str(
        error.get("type", "")
    )


def refusal_of(message: AIMessage) -> str | None:
    """Why a reply that arrived as a message is a refusal (a chat model other than ours, whose HTTP is not
    checked by prompt_r1.clients.http_client), or None."""
    if (message.response_metadata or {}).get("finish_reason") == "content_filter":
        return "the provider's content filter withheld the reply (finish_reason content_filter)"
    refusal = (message.additional_kwargs or {}).get("refusal")
    if refusal and not message.text:
        return f"the model refused: {str(refusal)[:200]!r}"
    return None
