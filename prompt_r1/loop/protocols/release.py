"""The `release` protocol: the reference release's training rollout, its texts and rules, for `--protocol release`.

The public repository QwenQKing/Prompt-R1 (commit 2c51728) trains its agent with `run_prompt-R1.sh`, which runs
`promptr1_agent.src.main_agent`. Its rollout differs from the paper's text, which our default protocol (`paper`)
follows. Each rule below names the release file it comes from; `ReleaseProtocol` (at the end) is how the loop,
the rollout and the evaluation apply them (prompt_r1.loop.protocols.base has the interface). The JSON calls and
replies are written and read back in prompt_r1.loop.protocols.release_calls (its names are importable here too).

- The first prompt (`src/agent_rl_dataset.py`, `use_default_tool_template: True` in `src/config/agent_trainer.yaml`)
  is the chat template applied with one tool, `prompt` (`tool/tools/LLM_tool.py`, in `tool/base.py`'s
  `tool_description` shape), and tokenised without special tokens added. The template is the release's
  `Prompr-R1_Qwen3_chat_template.jinja`, shipped here byte for byte as `release_chat_template.jinja`: its system
  block declares the tool and asks for `{"name": …, "arguments": …}` inside `<interaction_prompt>` tags. That this
  template, and not Qwen3's own, was the tokenizer's at training time is inferred: the code only calls
  `apply_chat_template(messages, tools=...)`, and the custom template is the one whose tags the rest of the code
  parses.
- A turn ends on the end-of-turn token alone (`run_prompt-R1.sh`: `rollout.stop_token_ids=[151645]`,
  `rollout.stop=[]`); that token is sampled, kept and trained on.
- A turn with no `<interaction_prompt>…</interaction_prompt>` ends the episode (`tool/envs/nous.py`, `batch_step`
  with `use_batch_tool_calls: True`). Otherwise the first one is read as a JSON call; one that is not a call of
  the `prompt` tool with a string `arguments.prompt` is answered with an error text (`Error: JSONDecodeError`,
  `Error: No tool name`, …) instead of calling the environment, and the episode goes on.
- The environment (`tool/tools/LLM_tool.py`) gets a system prompt with a trailing space, then the earlier
  (prompt, reply) pairs as `llm_agent/generation.py` records them, then the prompt; no temperature or max_tokens
  is sent, and its reply is `.strip()`-ed and sent back as `json.dumps({"results": [reply]})`.
- Every reply or error text is cut at 2,048 characters plus "..." (`max_tool_response_length=2048`) and appended
  as `<|im_end|>\\n<|im_start|>user\\n<interaction_response>\\n…\\n</interaction_response><|im_end|>\\n<|im_start|>
  assistant\\n<think>\\n` (`nous.py`, `format_tool_response`), after the agent's own sampled `<|im_end|>`: two
  end-of-turn tokens in a row, and `<think>\\n` prefilled for the next turn.
  The content is not escaped (`format_tool_response` wraps it as it is, and `json.dumps` escapes neither `<` nor
  `/`): a reply holding `</interaction_response>` or `<|im_end|>` reaches the agent as written, as in the release;
  only the paper protocol defuses such tags (protocol.py).
- `max_turns` counts agent generations (`generation.py`, `run_llm_loop`); a call in the last one is still
  answered, then the episode ends unanswered. Before each generation the episode stops when prompt and trajectory
  exceed the prompt limit (8,192 tokens; token path only). The trajectory the trainer gets is cut at the same
  number of tokens (`_update_rolling_state`'s `max_response_length=8192`; `prompt_r1/training/sync/rollout.py`).
- The environment's history is each episode's own earlier (prompt, reply) pairs. The release builds it for a
  whole batch and pads the replies to the batch twice (`run_llm_loop`, `_update_conversation_history`), so once
  an earlier episode of its batch has ended, a later one's history can pair its prompt with another episode's
  reply; that accident of batching is not reproduced.
- The reward (`src/agent_reward_manager.py`) scores the decoded prompt and trajectory, special tokens kept, with
  `compute_score_format_answer` (`src/reward_score/qa_em_and_format.py`; our reward preset `release`), placed on
  the last token; GRPO sums it over the agent's tokens only (`src/core_algos.py`,
  `compute_grpo_outcome_advantage`), so an episode that ends on an environment token gets 0.
- Padding ids are dropped from the trajectory, the agent's sampled ones (Qwen3's `<|endoftext|>` also ends a
  turn) and any a reply spells out (`generation.py`, `_update_rolling_state`).

API errors become the observation text in the release (`LLM_tool.py` returns `str(e)`); here the environment
client retries them, and an episode whose calls still fail, are refused, or overflow the environment's context
gets no reward and is left out of its group.
"""

from __future__ import annotations

import json
from dataclasses import replace
from functools import cache
from importlib import resources
from typing import Any, Literal

from prompt_r1.core.errors import ConfigError
from prompt_r1.core.prompts import ENVIRONMENT_SYSTEM_PROMPT, question_message
from prompt_r1.core.protocol import AgentTurn, parse_agent_output
from prompt_r1.loop.protocols.base import LoopProtocol, TurnBudget, reply_usage
from prompt_r1.loop.protocols.release_calls import (
    PROMPT_TOOL,
    ReleaseCall,
    environment_history,
    history_reply,
    read_call,
    release_turn,
    reply_content,
)

__all__ = [
    "ENVIRONMENT_SYSTEM_PROMPT_RELEASE",
    "MAX_OBSERVATION_CHARS",
    "PREFILL",
    "PROMPT_TOOL",
    "ReleaseCall",
    "ReleaseProtocol",
    "agent_messages",
    "chat_template",
    "episode_reward",
    "check_tokenizer",
    "environment_history",
    "first_prompt_ids",
    "first_prompt_text",
    "history_reply",
    "observation",
    "observation_body",
    "observation_update",
    "read_call",
    "release_turn",
    "reply_content",
    "stream_text",
    "system_text",
    "transcript",
    "without_padding",
]

# LLM_tool.py's system message: ours with the space it ends with.
ENVIRONMENT_SYSTEM_PROMPT_RELEASE = ENVIRONMENT_SYSTEM_PROMPT + " "

MAX_OBSERVATION_CHARS = 2048  # run_prompt-R1.sh: tool.max_tool_response_length=2048
END_OF_TURN = "<|im_end|>"
_OBSERVATION_HEAD = "<|im_end|>\n<|im_start|>user\n"
PREFILL = "<think>\n"
_OBSERVATION_TAIL = "<|im_end|>\n<|im_start|>assistant\n" + PREFILL


@cache
def chat_template() -> str:
    """The release's chat template (`Prompr-R1_Qwen3_chat_template.jinja`, byte for byte)."""
    return (
        resources.files("prompt_r1.loop.protocols")
        .joinpath("release_chat_template.jinja")
        .read_text(encoding="utf-8")
    )


def check_tokenizer(tokenizer: Any) -> None:
    """The release's stream is Qwen's chat format with its markers written out: a tokenizer must know
    `<|im_end|>` and `<|im_start|>` as single tokens, or the stream would spell them in pieces; and its padding
    token must not be its end-of-turn token, which the release's dropping of padding ids would remove."""
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id == tokenizer.eos_token_id:
        raise ConfigError(
            "the release protocol drops padding ids from the trajectory, and this agent's tokenizer pads with its "
            f"end-of-sequence token {tokenizer.eos_token!r}; use a chat model's tokenizer (Qwen3, Qwen2.5-Instruct: "
            "<|endoftext|> pads, <|im_end|> ends a turn) or --protocol paper"
        )
    unknown = getattr(tokenizer, "unk_token_id", None)
    for marker in (END_OF_TURN, "<|im_start|>"):
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) != 1 or ids[0] == unknown:
            raise ConfigError(
                f"the release protocol writes Qwen's chat markers, and this agent's tokenizer does not have "
                f"{marker} as one token; use a Qwen-format agent (Qwen3, Qwen2.5) or --protocol paper"
            )


def first_prompt_text(tokenizer: Any, question: str) -> str:
    """Turn 1 as the release renders it: the question message with the `prompt` tool, through its template."""
    messages = [{"role": "user", "content": question_message(question)}]
    return tokenizer.apply_chat_template(
        messages,
        tools=[PROMPT_TOOL],
        chat_template=chat_template(),
        add_generation_prompt=True,
        tokenize=False,
    )


def first_prompt_ids(tokenizer: Any, question: str) -> list[int]:
    return list(tokenizer.encode(first_prompt_text(tokenizer, question), add_special_tokens=False))


@cache
def system_text() -> str:
    """The system message's content in the first prompt, for a chat endpoint (which renders its own markers)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def tojson(value: Any) -> str:  # transformers' filter: no ASCII escaping, keys in order
        return json.dumps(value, ensure_ascii=False)

    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    environment.filters["tojson"] = tojson
    rendered = environment.from_string(chat_template()).render(
        messages=[{"role": "user", "content": "q"}], tools=[PROMPT_TOOL], add_generation_prompt=False
    )
    head = "<|im_start|>system\n"
    return rendered[len(head) : rendered.index(END_OF_TURN)]


def observation_body(content: str) -> str:
    """The user message's content: `content` cut at 2,048 characters plus "...", in the response tags."""
    if len(content) > MAX_OBSERVATION_CHARS:
        content = content[:MAX_OBSERVATION_CHARS] + "..."
    return f"<interaction_response>\n{content}\n</interaction_response>"


def observation(content: str) -> str:
    """The text appended to the trajectory after an agent turn that called (nous.py, `format_tool_response`)."""
    return _OBSERVATION_HEAD + observation_body(content) + _OBSERVATION_TAIL


def observation_update(index: int, text: str, reply: Any, tokenizer: Any) -> tuple[dict[str, Any], dict]:
    """The graph's state update and the event for the answer to turn `index`'s call: the environment's `reply`
    (its stripped `text` sent back as JSON), or, when `reply` is None, the call's error `text`. Cut and wrapped as
    one user message; with a `tokenizer` (the token path) appended whole after the agent's own end-of-turn
    token, the next turn's `<think>\n` prefilled, none of it trained on."""
    content = reply_content(text) if reply is not None else text
    record: dict[str, Any] = {
        "index": index,
        "response": text,
        "response_source": "environment" if reply is not None else "call_error",
        "observation": observation_body(content),
    }
    update: dict[str, Any] = {"turns": [record]}
    if reply is not None:
        record["environment_call"] = reply.to_dict()
        update["usage"] = reply_usage(reply)
        event = {"type": "response", "turn": index, "text": text, "attempts": reply.attempts}
        event["latency_s"] = round(reply.latency_s, 3)
    else:
        event = {"type": "call_error", "turn": index, "text": text}
    if tokenizer is not None:
        ids = without_padding(tokenizer, tokenizer.encode(observation(content), add_special_tokens=False))
        update.update(completion_ids=ids, logprobs=[0.0] * len(ids), env_mask=[0] * len(ids))
    return update, event


def without_padding(tokenizer: Any, ids: list[int]) -> list[int]:
    """`ids` without the padding token's, as the release keeps its responses (generation.py,
    `_update_rolling_state`): a sampled `<|endoftext|>` (Qwen3's padding, also an end of turn) or one a reply
    spelled out. The release's vLLM prompt kept a reply's padding ids; a trajectory here is one stream."""
    pad = tokenizer.pad_token_id
    return [token for token in ids if token != pad] if pad is not None else list(ids)


def agent_messages(question: str, turns: list[dict]) -> list[dict[str, str]]:
    """The agent's chat for a chat-only endpoint: the tools system block, the question, each turn and its
    observation. Only the token path can prefill `<think>\\n` or send the doubled end-of-turn token."""
    messages = [
        {"role": "system", "content": system_text()},
        {"role": "user", "content": question_message(question)},
    ]
    for turn in turns:
        messages.append({"role": "assistant", "content": turn["text"]})
        if turn.get("observation") is not None:
            messages.append({"role": "user", "content": turn["observation"]})
    return messages


def stream_text(question: str, turns: list[dict]) -> str:
    """The text the release's reward reads, rebuilt from an episode's turn records (eval's reward): on the token
    path it is `transcript(tokenizer, prompt_ids + completion_ids)` (tested), but for a turn that ended on the
    padding token (one `<|im_end|>` more, the same score) and a trajectory over training's cut at
    `max_total_tokens`. A chat-only episode gets the same form; its agent was not prefilled, so the `<think>` it
    opens a later turn with stands for the prefill."""
    text = (
        f"<|im_start|>system\n{system_text()}{END_OF_TURN}\n<|im_start|>user\n{question_message(question)}"
        f"{END_OF_TURN}\n<|im_start|>assistant\n"
    )
    for k, turn in enumerate(turns):
        body = turn["text"]
        for opening in (PREFILL, "<think>") if k > 0 else ():  # the prefill is in the observation's tail
            if body.startswith(opening):
                body = body[len(opening) :]
                break
        text += body
        if turn.get("finish_reason") != "length":  # it stopped on its end-of-turn token
            text += END_OF_TURN
        if turn.get("observation") is not None:
            text += _OBSERVATION_HEAD + turn["observation"] + _OBSERVATION_TAIL
    return text if text.endswith(END_OF_TURN) else text + END_OF_TURN


def episode_reward(question: str, turns: list[dict], golden_answers: Any) -> Any:
    """The release's reward of an episode (a `RewardScore`): its stream scored by the `release` preset, with a
    total of 0 when the episode ended on the environment's message."""
    from prompt_r1.scoring.rewards import score_transcript

    score = score_transcript(stream_text(question, turns), golden_answers, "release")
    ended_on_environment = bool(turns) and turns[-1].get("observation") is not None
    return replace(score, total=0.0) if ended_on_environment else score


def transcript(tokenizer: Any, ids: list[int]) -> str:
    """The text the release's reward scores (agent_reward_manager.py): the ids decoded with special tokens, cut
    at the first padding token, ending with the end-of-sequence token."""
    text = tokenizer.decode(ids, skip_special_tokens=False)
    if tokenizer.pad_token_id is not None:
        text = text.split(tokenizer.decode([tokenizer.pad_token_id]))[0]
    eos = tokenizer.eos_token
    if eos and not text.endswith(eos):
        text += eos
    return text


class ReleaseProtocol(LoopProtocol):
    """The rules above, as the loop, the rollout and the evaluation ask for them."""

    name = "release"
    stop = ()  # a turn ends on the end-of-turn token alone
    environment_system_prompt = ENVIRONMENT_SYSTEM_PROMPT_RELEASE
    reward_preset = "release"
    fixed_reward_preset = True  # the release scores its decoded stream with its own coefficients
    reward_column_names = ("transcript", "ends_on_agent_token")

    def chat_template(self) -> str:
        return chat_template()

    def check_tokenizer(self, tokenizer: Any) -> None:
        check_tokenizer(tokenizer)

    def agent_messages(self, state: dict) -> list[dict[str, str]]:
        return agent_messages(state["question"], state.get("turns", []))

    def first_prompt_ids(self, tokenizer: Any, question: str) -> list[int]:
        return first_prompt_ids(tokenizer, question)

    def turn_budget(
        self, prompt_tokens: int, used: int, max_total_tokens: int, per_turn: int | None
    ) -> TurnBudget | None:
        # The release stops before a turn once prompt + trajectory exceed its limit, and never cuts a turn short.
        return None if prompt_tokens + used > max_total_tokens else TurnBudget(per_turn)

    def read_turn(self, text: str, *, index: int, token_exact: bool) -> tuple[AgentTurn, dict[str, Any]]:
        if token_exact and index > 0:
            text = PREFILL + text  # the turn as the agent's context has it: the prefill is its start
        return release_turn(parse_agent_output(text), text)

    def kept_ids(
        self, tokenizer: Any, ids: list[int], logprobs: list[float]
    ) -> tuple[list[int], list[float]]:
        if tokenizer.pad_token_id not in ids:
            return ids, logprobs
        # The release drops padding ids from what was sampled (Qwen3's <|endoftext|> also ends a turn).
        kept = [k for k, token in enumerate(ids) if token != tokenizer.pad_token_id]
        return [ids[k] for k in kept], [logprobs[k] for k in kept]

    def environment_history(self, turns: list[dict]) -> list[tuple[str, str]]:
        return environment_history(turns)

    def answer_without_environment(self, state: dict, tokenizer: Any) -> tuple[dict, dict] | None:
        last = state["turns"][-1]
        if not last.get("call_error"):
            return None
        return observation_update(last["index"], last["call_error"], None, tokenizer)

    def observe(self, state: dict, reply: Any, tokenizer: Any, max_total_tokens: int) -> tuple[dict, dict]:
        return observation_update(state["turns"][-1]["index"], reply.text.strip(), reply, tokenizer)

    def environment_overflow(self, index: int, error: str) -> dict:
        # The release would show the API's error text; like any failed call here, it fails the episode.
        return {
            "status": "environment_error",
            "error": error,
            "turns": [{"index": index, "error": error}],
            "usage": {"env_failed_calls": 1},
        }

    def route_prompt(self, state: dict, max_turns: int, force_final_answer: bool) -> Literal["environment"]:
        return (
            "environment"  # every call is answered, the last turn's too; the turn limit is checked after it
        )

    def turns_used_up(self, state: dict, max_turns: int) -> bool:
        return len(state["turns"]) >= max_turns  # max_turns counts agent generations

    def most_agent_turns(self, max_turns: int, force_final_answer: bool) -> int:
        return max_turns

    def finish_trajectory(
        self,
        tokenizer: Any,
        trajectory: tuple[list[int], list[float], list[int]],
        *,
        cut_off: bool,
        max_total_tokens: int,
    ) -> tuple[list[int], list[float], list[int]]:
        # Nothing is appended (an episode that ended on its environment's message ends there), and the trajectory
        # is cut at the release's response limit (max_response_length).
        completion, logprobs, mask = trajectory
        return (
            list(completion[:max_total_tokens]),
            list(logprobs[:max_total_tokens]),
            list(mask[:max_total_tokens]),
        )

    def reward_columns(
        self, tokenizer: Any, prompt_ids: list[int], completion: list[int], mask: list[int]
    ) -> dict:
        # What the release's reward reads: the decoded stream, and whose token ends it.
        return {
            "transcript": transcript(tokenizer, prompt_ids + completion),
            "ends_on_agent_token": bool(mask) and mask[-1] == 1,
        }

    def episode_reward(self, question: str, turns: list[dict], golden_answers: Any) -> Any:
        return episode_reward(question, turns, golden_answers)
