from __future__ import annotations

import json

import pytest

from prompt_r1.prompts import (
    ENVIRONMENT_SYSTEM_PROMPT,
    INSTRUCTION_TEMPLATE,
    extract_question,
    question_message,
)
from prompt_r1.protocol import cut_at_stop, parse_agent_output, repair_stopped_text


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
