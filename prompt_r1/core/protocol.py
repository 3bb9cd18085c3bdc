"""Parse one agent generation into a turn: think, then either an interaction prompt or an answer.

Malformed output is data, not an exception: `parse_agent_output` always returns an `AgentTurn`, whose
`defects` say what is missing or wrong, so the graph can end the episode and the reward can score it.
Parsing takes time linear in the text (plain string searches, no backtracking regex) and never raises, whatever
the text; a generation over `MAX_TURN_CHARS` is a malformed turn, not parsed.

    >>> turn = parse_agent_output("<think>short</think><interaction_prompt>Explain X</interaction_prompt> junk")
    >>> turn.kind, turn.prompt, turn.truncated
    ('prompt', 'Explain X', ' junk')
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = [
    "ANSWER_CLOSE",
    "MAX_TURN_CHARS",
    "PROMPT_CLOSE",
    "STOP_SEQUENCES",
    "AgentTurn",
    "cut_at_stop",
    "last_answer",
    "parse_agent_output",
    "repair_stopped_text",
    "tool_call_prompt",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
PROMPT_OPEN, PROMPT_CLOSE = "<interaction_prompt>", "</interaction_prompt>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"

# A generation longer than this (in characters) is a malformed turn, "too long", and is not parsed.
MAX_TURN_CHARS = 64 * 1024

# One agent generation ends at the first of these, like a stop sequence on a served model.
STOP_SEQUENCES: tuple[str, ...] = (PROMPT_CLOSE, ANSWER_CLOSE)

TurnKind = Literal["prompt", "answer", "malformed"]


@dataclass(frozen=True)
class AgentTurn:
    """One parsed agent generation.

    kind: "prompt" (send `prompt` to the environment), "answer" (episode ends), or "malformed".
    defects: human-readable problems; empty means the turn is well formed.
    text: the generation up to and including the first stop sequence; truncated: what came after it.
    """

    kind: TurnKind
    text: str
    think: str | None = None
    prompt: str | None = None
    answer: str | None = None
    defects: tuple[str, ...] = ()
    truncated: str = ""
    prompt_format: Literal["tags", "tool_call"] | None = None

    @property
    def format_ok(self) -> bool:
        return not self.defects

    def to_record(self) -> dict:
        """A JSON-serialisable dict, the form turns take in the graph state."""
        record = asdict(self)
        record["defects"] = list(self.defects)
        record["format_ok"] = self.format_ok
        return record


def cut_at_stop(text: str, stops: tuple[str, ...] = STOP_SEQUENCES) -> tuple[str, str]:
    """Split `text` after the earliest stop sequence: (kept, cut). No stop: (text, "").

    >>> cut_at_stop("<answer>a</answer> and more")
    ('<answer>a</answer>', ' and more')
    """
    best = -1
    for stop in stops:
        i = text.find(stop)
        if i >= 0 and (best < 0 or i + len(stop) < best):
            best = i + len(stop)
    if best < 0:
        return text, ""
    return text[:best], text[best:]


_UNKNOWN = object()


def repair_stopped_text(text: str, matched_stop: str | None | object = _UNKNOWN) -> str:
    """Re-append the stop sequence that an OpenAI-compatible server removed from a completion.

    `matched_stop` is what the server reported (vLLM's `stop_reason`): the matched string, or None when the
    generation ended on EOS, in which case nothing was removed and nothing is added. Servers that report nothing
    leave it unknown; then the tag opened last and left unclosed tells which stop matched.

    >>> repair_stopped_text("<think>t</think><interaction_prompt>p")
    '<think>t</think><interaction_prompt>p</interaction_prompt>'
    >>> repair_stopped_text("<think>t</think><answer>Paris", None)
    '<think>t</think><answer>Paris'
    """
    if matched_stop is not _UNKNOWN:
        return text + matched_stop if matched_stop in STOP_SEQUENCES else text
    unclosed = []
    for open_tag, close_tag in ((PROMPT_OPEN, PROMPT_CLOSE), (ANSWER_OPEN, ANSWER_CLOSE)):
        last_open = text.rfind(open_tag)
        if last_open >= 0 and text.find(close_tag, last_open) < 0:
            unclosed.append((last_open, close_tag))
    return text + max(unclosed)[1] if unclosed else text


def _between(text: str, open_tag: str, close_tag: str) -> tuple[str | None, list[str]]:
    """Content of the first open…close pair and the defects found around it."""
    defects: list[str] = []
    start = text.find(open_tag)
    if start < 0:
        return None, defects
    end = text.find(close_tag, start + len(open_tag))
    if end < 0:
        return None, [f"unclosed {open_tag}"]
    content = text[start + len(open_tag) : end]
    if open_tag in content:
        defects.append(f"nested {open_tag}")
    if text.count(open_tag) > 1 or text.count(close_tag) > 1:
        defects.append(f"repeated {open_tag}")
    return content, defects


def _tool_call_body(content: str) -> str | None:
    """The `{…}` of a tool call: whitespace, an optional <tool_call>…</tool_call> wrapper, whitespace, `{…}`.

    String handling rather than a regex: the regex's adjacent `\\s*` backtracked in quadratic time on whitespace.
    str.strip removes exactly the characters that `\\s` matches.

    >>> _tool_call_body(' <tool_call>\\n{"a": 1}\\n</tool_call> ')
    '{"a": 1}'
    >>> _tool_call_body('{"a": 1} trailing') is None
    True
    """
    body = content.strip()
    if body.startswith(TOOL_CALL_OPEN):
        body = body[len(TOOL_CALL_OPEN) :].lstrip()
    if body.endswith(TOOL_CALL_CLOSE):
        body = body[: -len(TOOL_CALL_CLOSE)].rstrip()
    if len(body) < 2 or body[0] != "{" or body[-1] != "}":
        return None
    return body


_NOT_JSON = object()


def _json(text: str) -> object:
    """json.loads, or _NOT_JSON for any text it refuses: invalid JSON, integers over Python's digit limit
    (ValueError), nesting deeper than the recursion limit (RecursionError)."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return _NOT_JSON


def tool_call_prompt(content: str) -> str | None:
    """The prompt inside the reference release's JSON form {"name": "prompt", "arguments": {"prompt": P}}, or None
    when `content` is not that form (the parser then keeps the tagged text as the prompt)."""
    body = _tool_call_body(content)
    if body is None:
        return None
    call = _json(body)
    if not isinstance(call, dict) or call.get("name") != "prompt":
        return None
    arguments = call.get("arguments")
    if isinstance(arguments, str):  # some servers double-encode tool arguments
        arguments = _json(arguments)
    prompt = arguments.get("prompt") if isinstance(arguments, dict) else None
    return prompt if isinstance(prompt, str) else None


def parse_agent_output(text: str) -> AgentTurn:
    """Parse one agent generation. Never raises; time linear in len(text).

    >>> parse_agent_output("<think>done</think><answer>Paris</answer>").answer
    'Paris'
    >>> parse_agent_output("no tags at all").defects
    ('missing <think>…</think>', 'neither <interaction_prompt> nor <answer>')
    >>> parse_agent_output("x" * (MAX_TURN_CHARS + 1)).defects
    ('too long: 65537 characters, over the 64 KiB bound',)
    """
    if len(text) > MAX_TURN_CHARS:
        too_long = f"too long: {len(text)} characters, over the {MAX_TURN_CHARS // 1024} KiB bound"
        return AgentTurn(kind="malformed", text=text, defects=(too_long,))
    kept, truncated = cut_at_stop(text)
    defects: list[str] = []

    think, think_defects = _between(kept, THINK_OPEN, THINK_CLOSE)
    defects += think_defects
    if think is None and not think_defects:
        defects.append("missing <think>…</think>")
    elif think is not None and not think.strip():
        defects.append("empty <think>")

    # Only one action can close first, because the text was cut after the earliest stop sequence.
    answer, answer_defects = _between(kept, ANSWER_OPEN, ANSWER_CLOSE)
    prompt, prompt_defects = _between(kept, PROMPT_OPEN, PROMPT_CLOSE)
    common = dict(text=kept, think=think, truncated=truncated)

    if answer is not None:
        defects += answer_defects
        answer = answer.strip()
        if not answer:
            defects.append("empty <answer>")
        if think is not None and kept.find(THINK_CLOSE) > kept.find(ANSWER_OPEN):
            defects.append("<answer> before </think>")
        return AgentTurn(kind="answer", answer=answer, defects=tuple(defects), **common)

    if prompt is not None:
        defects += prompt_defects
        prompt_format: Literal["tags", "tool_call"] = "tags"
        from_json = tool_call_prompt(prompt)
        if from_json is not None:
            prompt, prompt_format = from_json, "tool_call"
        prompt = prompt.strip()
        if not prompt:
            # An empty prompt cannot be sent: the turn is malformed, not merely imperfect.
            return AgentTurn(kind="malformed", defects=(*defects, "empty <interaction_prompt>"), **common)
        if think is not None and kept.find(THINK_CLOSE) > kept.find(PROMPT_OPEN):
            defects.append("<interaction_prompt> before </think>")
        return AgentTurn(
            kind="prompt", prompt=prompt, defects=tuple(defects), prompt_format=prompt_format, **common
        )

    defects += answer_defects + prompt_defects
    if not answer_defects and not prompt_defects:
        defects.append("neither <interaction_prompt> nor <answer>")
    return AgentTurn(kind="malformed", defects=tuple(defects), **common)


def last_answer(text: str) -> str | None:
    """The stripped content of the last complete `<answer>…</answer>` in free text, or None.

    Free-form replies (the evaluation baselines) may quote the tags while reasoning; the last pair is the answer.

    >>> last_answer("I think <answer>x</answer>, no: <answer> Paris </answer>")
    'Paris'
    """
    # Pairs as a lazy regex's findall makes them, without its quadratic time on many unclosed openings:
    # an opening with no closing after it ends the search, since no later opening can have one either.
    last = None
    start = text.find(ANSWER_OPEN)
    while start >= 0:
        end = text.find(ANSWER_CLOSE, start + len(ANSWER_OPEN))
        if end < 0:
            break
        last = (start + len(ANSWER_OPEN), end)
        start = text.find(ANSWER_OPEN, end + len(ANSWER_CLOSE))
    return text[last[0] : last[1]].strip() if last else None
