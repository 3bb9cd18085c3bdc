"""Token-level rendering for token-exact trajectories.

The agent is conditioned on token ids, never on re-rendered text: its sampled ids are kept as they are and
only the environment's message is rendered, as the chat template renders a user turn followed by the next
assistant header. Re-rendering a whole conversation drifts from what was sampled (Qwen3's template, for one,
drops earlier <think> blocks), so nothing here ever re-renders earlier turns.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

__all__ = ["initial_prompt_ids", "token_id_list", "turn_end_ids", "user_turn_ids"]

_DUMMY_ASSISTANT = "PROMPTR1ASSISTANTPLACEHOLDER"
_DUMMY_USER = "PROMPTR1USERPLACEHOLDER"


def token_id_list(encoded: Any) -> list[int]:
    """The ids `tokenizer.apply_chat_template(..., tokenize=True)` returned, as a list: a list in older
    transformers, a BatchEncoding/dict (its `input_ids`) in newer ones."""
    if isinstance(encoded, dict) or hasattr(encoded, "input_ids"):
        encoded = encoded["input_ids"]
    return list(encoded)


def initial_prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Ids of the opening messages followed by the assistant generation header."""
    if all(m.keys() == {"role", "content"} and isinstance(m["content"], str) for m in messages):
        return list(_rendered_prompt_ids(tokenizer, tuple((m["role"], m["content"]) for m in messages)))
    return token_id_list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True))


@lru_cache(maxsize=256)
def _rendered_prompt_ids(tokenizer: Any, messages: tuple[tuple[str, str], ...]) -> tuple[int, ...]:
    # A GRPO step opens each question's group of episodes on the same messages: the chat template is rendered and
    # tokenised once per question, not once per episode (it was a fifth of the loop's time in step_overhead.py).
    conversation = [{"role": role, "content": content} for role, content in messages]
    return tuple(
        token_id_list(tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=True))
    )


@lru_cache(maxsize=64)
def _user_turn_frame(tokenizer: Any) -> tuple[str, str]:
    """(head, tail) around a user message's content, from the end of an assistant turn to the next header.

    Found by rendering a placeholder conversation and cutting right after the placeholder assistant content,
    so the head includes the template's end-of-turn marker (e.g. "<|im_end|>\\n<|im_start|>user\\n").
    """
    conversation = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": _DUMMY_ASSISTANT},
        {"role": "user", "content": _DUMMY_USER},
    ]
    text = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    start = text.rindex(_DUMMY_ASSISTANT) + len(_DUMMY_ASSISTANT)
    frame = text[start:]
    head, _, tail = frame.partition(_DUMMY_USER)
    return head, tail


def user_turn_ids(tokenizer: Any, content: str, sampled_ids: list[int]) -> list[int]:
    """Ids that close the agent's turn, carry a user message with `content`, and open the next agent turn.

    When the agent's sampled ids already end with the template's end-of-turn token(s) (it stopped on EOS
    rather than on a stop string), those are not repeated.
    """
    head, tail = _user_turn_frame(tokenizer)
    ids = list(tokenizer.encode(head + content + tail, add_special_tokens=False))
    for k in range(min(len(sampled_ids), 3), 0, -1):
        if sampled_ids[-k:] == ids[:k]:
            return ids[k:]
    return ids


@lru_cache(maxsize=64)
def _turn_end_text(tokenizer: Any) -> str:
    """What the chat template writes after an assistant message's content, up to its end-of-turn marker
    (e.g. "<|im_end|>"; the newline after it belongs to the next turn, and a trajectory must end on the marker)."""
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _DUMMY_ASSISTANT}]
    text = tokenizer.apply_chat_template(conversation, tokenize=False)
    return text[text.rindex(_DUMMY_ASSISTANT) + len(_DUMMY_ASSISTANT) :].rstrip()


def turn_end_ids(tokenizer: Any, sampled_ids: list[int]) -> list[int]:
    """Ids that close the agent's last turn as the chat template renders it, minus what it already sampled.

    Falls back to the EOS token when the template writes nothing after an assistant message.
    """
    text = _turn_end_text(tokenizer)
    ids = list(tokenizer.encode(text, add_special_tokens=False)) if text else []
    if not ids and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    for k in range(min(len(sampled_ids), len(ids)), 0, -1):
        if sampled_ids[-k:] == ids[:k]:
            return ids[k:]
    return ids
