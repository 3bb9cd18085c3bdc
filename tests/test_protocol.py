from __future__ import annotations

import json
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prompt_r1.core.prompts import (
    ENVIRONMENT_SYSTEM_PROMPT,
    INSTRUCTION_TEMPLATE,
    extract_question,
    question_message,
)
from prompt_r1.core.protocol import (
    MAX_TURN_CHARS,
    STOP_SEQUENCES,
    AgentTurn,
    cut_at_stop,
    last_answer,
    parse_agent_output,
    repair_stopped_text,
    tool_call_prompt,
)


def test_instruction_template_is_the_released_text(release_row):
    prompt = release_row["prompt"]
    assert prompt.endswith("\n" + INSTRUCTION_TEMPLATE)
    question = extract_question(prompt)
    assert question and question.startswith("Which virus")
    assert question_message(question) == prompt


def test_extract_question_rejects_other_text():
    assert extract_question("What is this?") is None
    assert extract_question("Question: no template here") is None


def test_environment_system_prompt_wording():
    assert ENVIRONMENT_SYSTEM_PROMPT.startswith(
        "You are a helpful assistant. Please read the provided content"
    )


def test_prompt_turn():
    turn = parse_agent_output("<think>why</think>\n<interaction_prompt> Explain X </interaction_prompt>")
    assert (turn.kind, turn.think, turn.prompt, turn.defects, turn.prompt_format) == (
        "prompt",
        "why",
        "Explain X",
        (),
        "tags",
    )
    assert turn.format_ok


def test_answer_turn():
    turn = parse_agent_output("<think>done</think><answer> Paris </answer>")
    assert (turn.kind, turn.answer, turn.format_ok) == ("answer", "Paris", True)


def test_text_after_prompt_is_cut_like_a_stop_sequence():
    raw = "<think>a</think><interaction_prompt>p</interaction_prompt><interaction_response>invented</interaction_response>"
    turn = parse_agent_output(raw)
    assert turn.text == "<think>a</think><interaction_prompt>p</interaction_prompt>"
    assert turn.truncated == "<interaction_response>invented</interaction_response>"
    assert turn.kind == "prompt" and turn.format_ok


def test_first_closing_tag_wins():
    turn = parse_agent_output("<think>a</think><answer>x</answer><interaction_prompt>p</interaction_prompt>")
    assert turn.kind == "answer" and turn.answer == "x"
    assert turn.truncated == "<interaction_prompt>p</interaction_prompt>"


@pytest.mark.parametrize(
    "call",
    [
        {"name": "prompt", "arguments": {"prompt": "Explain X"}},
        {"name": "prompt", "arguments": json.dumps({"prompt": "Explain X"})},
    ],
)
def test_tool_call_json_form(call):
    turn = parse_agent_output(
        f"<think>t</think><interaction_prompt>\n{json.dumps(call)}\n</interaction_prompt>"
    )
    assert turn.kind == "prompt" and turn.prompt == "Explain X" and turn.prompt_format == "tool_call"


def test_json_that_is_not_a_prompt_call_is_sent_verbatim():
    body = '{"name": "search", "arguments": {"query": "x"}}'
    turn = parse_agent_output(f"<think>t</think><interaction_prompt>{body}</interaction_prompt>")
    assert turn.prompt == body and turn.prompt_format == "tags"


@pytest.mark.parametrize(
    ("text", "kind", "defect"),
    [
        ("plain text", "malformed", "neither <interaction_prompt> nor <answer>"),
        ("<think>t</think>", "malformed", "neither <interaction_prompt> nor <answer>"),
        ("<interaction_prompt>p</interaction_prompt>", "prompt", "missing <think>…</think>"),
        ("<think></think><interaction_prompt>p</interaction_prompt>", "prompt", "empty <think>"),
        (
            "<think>t</think><interaction_prompt>  </interaction_prompt>",
            "malformed",
            "empty <interaction_prompt>",
        ),
        ("<think>t</think><answer> </answer>", "answer", "empty <answer>"),
        (
            "<think>t</think><interaction_prompt>cut off by the token limit",
            "malformed",
            "unclosed <interaction_prompt>",
        ),
        ("<think>t<interaction_prompt>p</interaction_prompt>", "prompt", "unclosed <think>"),
        ("<think>a</think><think>b</think><answer>x</answer>", "answer", "repeated <think>"),
        ("<think>a <think>b</think><answer>x</answer>", "answer", "nested <think>"),
        ("<answer>x</answer><think>late</think>", "answer", "missing <think>…</think>"),
    ],
)
def test_malformed_output_is_data(text, kind, defect):
    turn = parse_agent_output(text)
    assert turn.kind == kind
    assert defect in turn.defects
    assert not turn.format_ok
    record = turn.to_record()
    assert json.loads(json.dumps(record)) == record  # state-ready


def test_cut_at_stop_without_stop():
    assert cut_at_stop("no stop here") == ("no stop here", "")


@pytest.mark.parametrize(
    ("text", "stop", "expected"),
    [
        (
            "<think>t</think><interaction_prompt>p",
            "?",
            "<think>t</think><interaction_prompt>p</interaction_prompt>",
        ),
        ("<think>t</think><answer>a", "?", "<think>t</think><answer>a</answer>"),
        ("<think>t</think><answer>a", "</answer>", "<think>t</think><answer>a</answer>"),
        # the server said the generation ended on EOS: nothing was stripped, nothing is added
        ("<think>t</think><answer>a", None, "<think>t</think><answer>a"),
        # the tag opened last is the one the stop closed, whatever tags the thinking mentions
        (
            "<think>use <interaction_prompt> or answer</think><answer>Paris",
            "?",
            "<think>use <interaction_prompt> or answer</think><answer>Paris</answer>",
        ),
        ("<think>t</think><answer>a</answer>", "?", "<think>t</think><answer>a</answer>"),
        ("no tags", "?", "no tags"),
    ],
)
def test_repair_stopped_text(text, stop, expected):
    """stop "?" stands for a server that reports no stop reason."""
    assert (repair_stopped_text(text) if stop == "?" else repair_stopped_text(text, stop)) == expected


def test_package_import_is_lazy():
    """`import prompt_r1` must not pull in the OpenAI/LangChain clients (seconds of import time)."""
    import subprocess
    import sys

    code = "import sys, prompt_r1; print(sorted(m for m in ('openai', 'langchain_core', 'torch') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    from prompt_r1 import build_graph

    assert callable(build_graph)


def test_last_answer_takes_the_last_complete_pair():
    assert last_answer("<answer>a</answer> then <answer> b </answer>") == "b"
    assert last_answer("<answer>a<answer>b</answer>") == "a<answer>b"  # pairs as a regex's findall makes them
    assert last_answer("<answer>a</answer><answer>unclosed") == "a"
    assert last_answer("<answer>unclosed") is None
    assert last_answer("no tags") is None


# Hostile input: the parser is linear in its input and never raises; a turn over the bound is not parsed.

_PROMPT_TURN = "<think>t</think><interaction_prompt>{}</interaction_prompt>"


def _nested(depth: int) -> str:
    return '{"a":' + "[" * depth + "]" * depth + "}"


def test_long_whitespace_in_an_interaction_prompt():
    """Two adjacent \\s* in the old tool-call regex took 20 s on 64k spaces."""
    text = _PROMPT_TURN.format(" " * 64_000 + "x")
    assert len(text) <= MAX_TURN_CHARS
    turn = parse_agent_output(text)
    assert (turn.kind, turn.prompt, turn.prompt_format, turn.defects) == ("prompt", "x", "tags", ())


@pytest.mark.parametrize(
    "body",
    [
        _nested(2_500),
        '{"name": "prompt", "arguments": ' + _nested(2_500) + "}",
        '{"name": "prompt", "arguments": {"prompt": ' + _nested(2_500) + "}}",
        json.dumps({"name": "prompt", "arguments": _nested(2_500)}),  # double-encoded arguments
        "<tool_call>" + _nested(20_000) + "</tool_call>",
    ],
    ids=["bare", "arguments", "prompt", "double-encoded", "20k-deep"],
)
def test_deeply_nested_json_is_not_a_tool_call(body):
    """JSON nested past the recursion limit made json.loads raise RecursionError out of the parser."""
    turn = parse_agent_output(_PROMPT_TURN.format(body))
    assert (turn.kind, turn.prompt, turn.prompt_format) == ("prompt", body, "tags")


def test_turn_over_the_bound_is_malformed_without_parsing():
    text = "<think>t</think><answer>" + "x" * MAX_TURN_CHARS + "</answer>"
    turn = parse_agent_output(text)
    assert MAX_TURN_CHARS == 64 * 1024
    assert (turn.kind, turn.text, turn.truncated, turn.answer) == ("malformed", text, "", None)
    assert len(turn.defects) == 1 and turn.defects[0].startswith("too long")
    assert str(len(text)) in turn.defects[0]
    record = turn.to_record()
    assert json.loads(json.dumps(record)) == record


def test_turn_at_the_bound_is_parsed():
    text = "<think>t</think><answer>x</answer>"
    text += " " * (MAX_TURN_CHARS - len(text))
    turn = parse_agent_output(text)
    assert (turn.kind, turn.answer, turn.defects) == ("answer", "x", ())


@pytest.mark.parametrize(
    "text",
    [
        "\ud800",
        "<think>\udfff</think><answer>\ud800</answer>",
        '<think>t</think><interaction_prompt>{"name": "prompt", "arguments": {"prompt": "\ud800"}}</interaction_prompt>',
        '<think>t</think><interaction_prompt>{"name": "prompt", "arguments": {"prompt": "\\ud800"}}</interaction_prompt>',
        '<think>t</think><interaction_prompt>{"name": "prompt", "arguments": {"prompt": 1'
        + "0" * 5_000
        + "}}</interaction_prompt>",
        "<think>t</think><interaction_prompt><tool_call>{</tool_call></interaction_prompt>",
    ],
    ids=["lone", "tags", "raw-in-json", "escaped-in-json", "5000-digit-int", "lone-brace"],
)
def test_odd_strings_do_not_raise(text):
    turn = parse_agent_output(text)
    assert isinstance(turn, AgentTurn) and turn.text + turn.truncated == text
    record = turn.to_record()
    assert json.loads(json.dumps(record)) == record


_OLD_TOOL_CALL = re.compile(r"^\s*(?:<tool_call>)?\s*(\{.*\})\s*(?:</tool_call>)?\s*$", re.DOTALL)


def _old_tool_call_prompt(content: str) -> str | None:
    """The regex version that the string handling replaced (quadratic on long whitespace: short inputs only)."""
    match = _OLD_TOOL_CALL.match(content)
    if not match:
        return None
    try:
        call = json.loads(match.group(1))
    except (ValueError, RecursionError):
        return None
    if not isinstance(call, dict) or call.get("name") != "prompt":
        return None
    arguments = call.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return None
    prompt = arguments.get("prompt") if isinstance(arguments, dict) else None
    return prompt if isinstance(prompt, str) else None


_TOOL_CALL_PIECES = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<tool_call",
        "{",
        "}",
        '"',
        "x",
        "{}",
        '{"name": "prompt", "arguments": {"prompt": "P"}}',
        '{"name": "prompt", "arguments": "{\\"prompt\\": \\"Q\\"}"}',
        " ",
        "\n",
        "\t",
        "\x0b",
        "\x1c",
        "\x85",
        "\xa0",
        "\u2003",
        "\u2028",
        "\u200b",  # not whitespace
    ]
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_TOOL_CALL_PIECES, max_size=12).map("".join))
def test_tool_call_form_accepts_what_the_regex_accepted(content):
    assert tool_call_prompt(content) == _old_tool_call_prompt(content)


_OLD_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(st.sampled_from(["<answer>", "</answer>", "<answer", "answer>", " x ", "\n"]), max_size=12).map(
        "".join
    )
)
def test_last_answer_pairs_as_the_regex_did(text):
    matches = _OLD_ANSWER_BLOCK.findall(text)
    assert last_answer(text) == (matches[-1].strip() if matches else None)


_PIECES = st.one_of(
    st.sampled_from(
        [
            "<think>",
            "</think>",
            "<interaction_prompt>",
            "</interaction_prompt>",
            "<answer>",
            "</answer>",
            "<tool_call>",
            "</tool_call>",
            "<",
            ">",
            "</",
            "{",
            "}",
            "[",
            "]",
            '"',
            ":",
            ",",
            "\\",
            "\\u",
            "\\ud800",
            "\ud800",
            "\udfff",
            " ",
            "\n",
            "\t",
            "\xa0",
            '"name"',
            '"prompt"',
            '"arguments"',
            '{"name": "prompt", "arguments": {"prompt": "',
            '{"name": "prompt", "arguments": "',
            "[" * 1_200,
            "1e999",
            "NaN",
        ]
    ),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=20),
)


_JSON_PIECES = st.sampled_from(
    [
        "[",
        "]",
        "{",
        "}",
        '"a"',
        ":",
        ",",
        '"',
        "\\",
        "\ud800",
        " ",
        "1",
        "[" * 1_200,
        "]" * 1_200,
        '{"prompt": "p"}',
    ]
)
# Text inside <interaction_prompt> that starts as a tool call, so that the JSON decoder sees it.
_TOOL_CALL_TURNS = st.builds(
    lambda head, body, tail: f"<think>t</think><interaction_prompt>{head}{body}}}</interaction_prompt>{tail}",
    st.sampled_from(
        ['{"a":', '{"name": "prompt", "arguments": ', '<tool_call> {"name": "prompt", "arguments": "']
    ),
    st.lists(_JSON_PIECES, max_size=12).map("".join),
    st.lists(_PIECES, max_size=3).map("".join),
)


@settings(max_examples=400, deadline=None)
@given(
    text=st.one_of(st.lists(_PIECES, max_size=30).map("".join), _TOOL_CALL_TURNS),
    matched_stop=st.one_of(st.none(), st.sampled_from(STOP_SEQUENCES), st.text(max_size=5)),
)
def test_parser_never_raises(text, matched_stop):
    turn = parse_agent_output(text)
    assert isinstance(turn, AgentTurn)
    assert turn.kind in ("prompt", "answer", "malformed")
    assert turn.text + turn.truncated == text
    assert turn.format_ok == (not turn.defects)
    kept, cut = cut_at_stop(text)
    assert kept + cut == text
    assert repair_stopped_text(text).startswith(text)
    assert repair_stopped_text(text, matched_stop).startswith(text)
    answer = last_answer(text)
    assert answer is None or isinstance(answer, str)


def _best_seconds(fn, arg, loops: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(loops):
            fn(arg)
        elapsed = time.perf_counter() - start
        best = min(best, elapsed)
        if elapsed > 1.0:  # already slow: more repeats would only take longer
            break
    return best


def _fill(prefix: str, unit: str, suffix: str, size: int) -> str:
    return prefix + unit * ((size - len(prefix) - len(suffix)) // len(unit)) + suffix


_THINK = "<think>t</think>"
_HOSTILE = {
    "spaces in a tool call": (
        parse_agent_output,
        lambda n: _fill(_THINK + "<interaction_prompt>", " ", "x</interaction_prompt>", n),
    ),
    "spaces after a tool call": (
        parse_agent_output,
        lambda n: _fill(
            _THINK + '<interaction_prompt><tool_call>{"name": "prompt"}', " ", "x</interaction_prompt>", n
        ),
    ),
    "deep nesting in a tool call": (
        parse_agent_output,
        lambda n: _PROMPT_TURN.format('{"name": "prompt", "arguments": ' + _nested((n - 100) // 2) + "}"),
    ),
    "unclosed <answer> (last_answer)": (last_answer, lambda n: _fill("", "<answer>", "", n)),
    "unclosed <answer> (parse)": (parse_agent_output, lambda n: _fill(_THINK, "<answer>", "", n)),
    "<interaction_prompt> openings": (
        parse_agent_output,
        lambda n: _fill(_THINK, "<interaction_prompt>", "", n),
    ),
    "<interaction_prompt> openings, one close": (
        parse_agent_output,
        lambda n: _fill(_THINK, "<interaction_prompt>", "</interaction_prompt>", n),
    ),
    "<answer> openings (repair)": (repair_stopped_text, lambda n: _fill("", "<answer>", "", n)),
    "near-stops (cut_at_stop)": (cut_at_stop, lambda n: _fill("", "</interaction_prompt", "", n)),
}


@pytest.mark.parametrize("shape", list(_HOSTILE))
def test_time_grows_linearly(shape):
    """Time at 64k characters over time at 16k: about 4 when linear, 16 when quadratic."""
    fn, make = _HOSTILE[shape]
    small, large = make(16_000), make(64_000)
    assert len(large) <= MAX_TURN_CHARS  # parsed, not cut off by the size bound
    loops = 1
    while _best_seconds(fn, small, loops, repeats=1) < 0.02:  # long enough to time reliably
        loops *= 2
    ratio = _best_seconds(fn, large, loops) / _best_seconds(fn, small, loops)
    assert ratio < 8, f"{shape}: 64k takes {ratio:.1f}x the time of 16k"
