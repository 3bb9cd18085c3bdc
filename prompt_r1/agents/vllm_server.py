"""What a served agent needs to be token-exact: is the server vLLM, and which tokenizer renders its turns.

Re-rendering a conversation through a chat template is not what training saw: Qwen3's template, the paper's
agent's, drops the `<think>` blocks of earlier assistant turns, so an agent trained on token-exact trajectories and
served through the chat API reads a different context at inference. vLLM's completions API takes a prompt as token
ids and returns the sampled ids with their log-probabilities (`return_token_ids`), so a served agent on vLLM can be
driven exactly as in training; other OpenAI-compatible endpoints (hosted fine-tunes) keep the chat path.

`rendering_drift` tells, for one episode, whether re-rendering its conversation with the chat template gives
other tokens than the token-exact trajectory: what a chat-path agent actually reads differs from training there.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prompt_r1.core.errors import ConfigError

__all__ = [
    "TokenExactPlan",
    "plan_token_exact",
    "rendering_drift",
    "served_model_root",
    "vllm_version",
]


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # a redirect is an answer that this is no vLLM /version
        return None


def vllm_version(base_url: str, timeout: float = 5.0) -> str | None:
    """The version a vLLM OpenAI-compatible server reports at `/version` beside its `/v1`, or None for any other
    server (or none reachable). vLLM serves /version without a key, so none is sent, and no redirect is followed."""
    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    opener = urllib.request.build_opener(_NoRedirects)
    try:
        with opener.open(urllib.request.Request(root + "/version"), timeout=timeout) as response:
            body = json.loads(response.read(65536))
    except (urllib.error.URLError, OSError, ValueError):
        return None
    version = body.get("version") if isinstance(body, dict) else None
    return version if isinstance(version, str) else None


def served_model_root(base_url: str, model: str, api_key: str | None, timeout: float = 5.0) -> str | None:
    """Where a vLLM server loaded `model` from (the `root` its `/v1/models` lists: a folder or a hub id), or None.
    The key goes where the agent's requests go anyway (the server may require it); no redirect is followed."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    opener = urllib.request.build_opener(_NoRedirects)
    try:
        request = urllib.request.Request(base_url.rstrip("/") + "/models", headers=headers)
        with opener.open(request, timeout=timeout) as response:
            body = json.loads(response.read(1 << 20))
    except (urllib.error.URLError, OSError, ValueError):
        return None
    entries = body.get("data") if isinstance(body, dict) else None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model and isinstance(entry.get("root"), str):
            return entry["root"]
    return None


FIRST_WITH_TOKEN_IDS = (
    0,
    10,
    2,
)  # vLLM's completions API returns sampled ids (return_token_ids) since 0.10.2


def _release(version: str) -> tuple[int, ...]:
    """'0.31.0+cpu' → (0, 31, 0); anything unreadable → () (taken as new enough: it said it was vLLM)."""
    import re

    numbers = []
    for part in version.split("+")[0].split(".")[:3]:
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
    return tuple(numbers)


class TokenExactPlan:
    """How a served agent's turns go: `tokenizer` set means as token ids; `reason` says why not, or how."""

    def __init__(self, tokenizer: Any, reason: str, drift_tokenizer: Any = None) -> None:
        self.tokenizer, self.reason = tokenizer, reason
        self.drift_tokenizer = drift_tokenizer if drift_tokenizer is not None else tokenizer


def _load_tokenizer(source: str, where: str = "--agent-tokenizer") -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:  # noqa: BLE001 (the tokenizers library raises bare Exceptions for a broken file)
        raise ConfigError(f"cannot load the agent tokenizer {source!r} ({where}): {exc}") from None
    if tokenizer.chat_template is None:
        raise ConfigError(f"the agent tokenizer {source!r} has no chat template")
    return tokenizer


def plan_token_exact(config: Any, api_key: str | None = None) -> TokenExactPlan:
    """Decide, once at start, whether a served agent's turns go as token ids (see the module docstring).

    The tokenizer comes from `--agent-tokenizer`, else the model name when it is a local folder, else, with
    `--agent-token-exact on`, the folder or hub id the vLLM server says it loaded the model from. (Not the server's `/tokenize`: the turns need the chat
    template rendered as text and the end-of-turn ids, which it does not give, and a decode-encode round trip
    through it is not guaranteed to give the ids back.)"""
    from prompt_r1.agents.builtin import resolve_model
    from prompt_r1.core.defaults import BUILTIN_MODEL_NAMES

    source = config.tokenizer or (config.model if Path(config.model).is_dir() else None)
    if (
        source is None and config.model in BUILTIN_MODEL_NAMES
    ):  # served under its built-in name: its folder's tokenizer
        source = resolve_model(config.model)
    where = "--agent-tokenizer" if config.tokenizer else "the served model's folder"
    version = None
    # Asked for token ids with no tokenizer at hand: the server may say where it loaded the model from. Otherwise
    # building the agent sends no request (it may be built inside an event loop, e.g. by `langgraph dev`).
    if source is None and config.token_exact == "on":
        version = vllm_version(config.base_url)
        if version is not None:
            source = served_model_root(config.base_url, config.model, api_key)
            where = "where the vLLM server says it loaded the model from"
    tokenizer, unusable = None, None
    if source:
        try:
            tokenizer = _load_tokenizer(source, where)
        except ConfigError as exc:
            # Named with --agent-tokenizer for token-exact turns: an error. Inferred from a model folder, or only
            # for the drift check: the turns go as chat messages, and the reason says why.
            if config.tokenizer and config.token_exact != "off":
                raise
            unusable = str(exc)
    if config.token_exact == "off":
        return TokenExactPlan(None, "turned off (--agent-token-exact off): chat messages", tokenizer)
    # Without a tokenizer the turns cannot be token ids, whatever serves them: the server need not be asked again.
    if version is None and tokenizer is not None:
        version = vllm_version(config.base_url)
    missing = None
    if tokenizer is None:
        missing = unusable or (
            "no tokenizer for the served model: name one with --agent-tokenizer (or, on vLLM, --agent-token-exact on "
            "takes the one the server loaded)"
        )
    elif version is None:
        missing = f"the served agent at {config.base_url} is not a vLLM server (no /version)"
    elif _release(version) and _release(version) < FIRST_WITH_TOKEN_IDS:
        missing = (
            f"the served agent's vLLM {version} returns no token ids from its completions API (return_token_ids "
            "came in 0.10.2)"
        )
    if missing is not None:
        if config.token_exact == "on":
            raise ConfigError(f"--agent-token-exact on: {missing}")
        return TokenExactPlan(None, f"{missing}: chat messages", tokenizer)
    return TokenExactPlan(tokenizer, f"token ids through vLLM {version}'s completions API")


def rendering_drift(tokenizer: Any, state: dict[str, Any]) -> dict[str, Any]:
    """Whether re-rendering the episode's conversation with the chat template gives the tokens of its token-exact
    trajectory: {"differs": bool, "first_difference": index or None, "tokens": (rendered, exact)}.

    The token-exact trajectory is rebuilt from the turn texts (the agent's turns encoded, the environment's
    messages rendered as training renders them), so this also works for an episode that ran on the chat path."""
    from prompt_r1.core.prompts import agent_messages, interaction_response
    from prompt_r1.core.tokens import initial_prompt_ids, token_id_list, user_turn_ids

    messages = agent_messages(state)
    exact = initial_prompt_ids(tokenizer, messages[:1])
    for turn in state.get("turns", []):
        sampled = list(tokenizer.encode(turn["text"], add_special_tokens=False))
        exact += sampled
        response = turn.get("response")
        if response is not None:
            body = (
                interaction_response(response) if turn.get("response_source") == "environment" else response
            )
            exact += user_turn_ids(tokenizer, body, sampled)
    last = state.get("turns", [])[-1:] or [None]
    open_turn = last[0] is not None and last[0].get("response") is not None
    rendered = token_id_list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=open_turn, tokenize=True)
    )
    if not open_turn:  # the conversation ends on the agent's turn: compare up to its end
        rendered = rendered[: len(exact)]
    first = next((i for i, (a, b) in enumerate(zip(rendered, exact, strict=False)) if a != b), None)
    if first is None and len(rendered) != len(exact):
        first = min(len(rendered), len(exact))
    return {"differs": first is not None, "first_difference": first, "tokens": [len(rendered), len(exact)]}
