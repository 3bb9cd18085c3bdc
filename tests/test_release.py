"""`--protocol release`: the reference release's training rollout, id for id.

Each expected stream here is built the release's way, step by step as its code does it (named in each helper),
from the same sampled ids: `apply_chat_template(messages, tools=[...])` and `tokenizer(raw_prompt)` for the first
prompt (agent_rl_dataset.py), the sampled ids as they are, then `tokenizer(format_tool_response(...))` for each
observation (nous.py). The tokenizer is built in-process in Qwen3's shape: its special and added tokens (`<think>`
one non-special token) and the release's chat template with the tools block.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re

import pytest
from jsonschema import ValidationError, validate

from prompt_r1.agents.base import AgentOutput
from prompt_r1.clients.environment import EnvironmentClient
from prompt_r1.core.config import EnvironmentConfig, LoopConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.prompts import extract_question
from prompt_r1.loop.graph import build_graph
from prompt_r1.loop.protocols import release
from prompt_r1.scoring.rewards import score_transcript, trl_reward
from prompt_r1.testing.servers import ScriptedServer
from prompt_r1.testing.tiny_models import build_tiny_model

# The release's files (QwenQKing/Prompt-R1 at 2c51728), as this test reads them.
RELEASE_TEMPLATE_BLOB = "0e407aa5744a8c0ea6adb79247810202af948929"  # Prompr-R1_Qwen3_chat_template.jinja
LLM_TOOL = {  # tool/tools/LLM_tool.py: name, description, parameters
    "name": "prompt",
    "description": "Give an explanation of the question in detail.",
    "parameters": {
        "type": "object",
        "properties": {"prompt": {"type": "string", "description": "Give question and its explanation"}},
        "required": ["prompt"],
    },
}
LLM_TOOL_SYSTEM = (  # LLM_tool.py's system message, trailing space included
    "You are a helpful assistant. Please read the provided content (including previous conversations and the "
    "current task) and help the user complete the task or answer the question. "
)
MAX_TOOL_RESPONSE_LENGTH = 2048  # run_prompt-R1.sh: tool.max_tool_response_length=2048


def tool_description() -> dict:  # tool/base.py: BaseTool.tool_description
    return {"type": "function", "function": LLM_TOOL}


def release_first_prompt(tokenizer, row_prompt: str) -> list[int]:
    """agent_rl_dataset.py, __getitem__: the row's messages with the tools, through the tokenizer's template."""
    raw_prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": row_prompt}],
        tools=[tool_description()],
        add_generation_prompt=True,
        tokenize=False,
    )
    return tokenizer(raw_prompt, add_special_tokens=False)["input_ids"]


def release_step(raw_response: str, execute) -> str | None:
    """nous.py, batch_step then format_tool_response, for one sample: the observation text, or None (no call)."""
    calls = []
    for text in re.findall(r"<interaction_prompt>(.*?)</interaction_prompt>", raw_response, re.DOTALL):
        try:
            calls.append(json.loads(text))
        except json.JSONDecodeError:
            calls.append(None)
    if not calls:
        return None
    call = calls[0]
    if call is None:
        response = "Error: JSONDecodeError"
    elif "name" not in call:
        response = "Error: No tool name"
    elif "arguments" not in call:
        response = "Error: No tool arguments"
    elif call["name"] != "prompt":
        response = "Error: ToolNotFoundError"
    else:
        try:
            validate(instance=call["arguments"], schema=LLM_TOOL["parameters"])
            response = execute(call["arguments"]["prompt"])
        except ValidationError:
            response = "Error: Invalid tool arguments"
    if len(response) > MAX_TOOL_RESPONSE_LENGTH:
        response = response[:MAX_TOOL_RESPONSE_LENGTH] + "..."
    return (
        "<|im_end|>\n<|im_start|>user\n"
        + f"<interaction_response>\n{response}\n</interaction_response>"
        + "<|im_end|>\n<|im_start|>assistant\n<think>\n"
    )


def llm_tool_result(answer: str) -> str:
    """LLM_tool.py: what a successful call returns."""
    return json.dumps({"results": [answer.strip()]})


class SampledIds:
    """An agent backend that 'samples' fixed ids, one list per turn, and records what it was asked."""

    def __init__(self, tokenizer, turns: list[list[int]]):
        self.tokenizer, self.turns, self.requests = tokenizer, list(turns), []

    async def generate(self, request):
        self.requests.append(request)
        ids = self.turns.pop(0)
        return AgentOutput(
            text=self.tokenizer.decode(ids, skip_special_tokens=True),
            token_ids=ids,
            logprobs=[-0.25] * len(ids),
            prompt_tokens=len(request.prompt_ids or []),
            completion_tokens=len(ids),
        )


@pytest.fixture(scope="module")
def qwen3_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("qwen3") / "model"
    build_tiny_model(folder, qwen3_tokens=True, chat_template=release.chat_template())
    return AutoTokenizer.from_pretrained(folder)


def ids_of(tokenizer, text: str, *, end: bool = True) -> list[int]:
    """A turn's sampled ids: the text's tokens, then the end-of-turn token it stopped on."""
    return tokenizer.encode(text, add_special_tokens=False) + ([tokenizer.eos_token_id] if end else [])


def call(prompt: str) -> str:
    return f"<interaction_prompt>\n{json.dumps({'name': 'prompt', 'arguments': {'prompt': prompt}})}\n</interaction_prompt>"


TURN_1 = "<think>\nThe question asks about a virus and its discoverer.\n</think>\n" + call(
    "Which virus was discovered by a former president of the Chinese Medical Association? Explain the question."
)
TURN_2 = "The reply names it.\n</think>\n<answer>SARS</answer>"
REPLY = (
    "  The virus is SARS — discovered by Zhong Nanshan (钟南山).\n\n"  # non-ASCII, padded: strip + escapes
)


def run(agent, environment, loop: LoopConfig, question: str) -> dict:
    graph = build_graph(agent, environment, loop=loop)
    return asyncio.run(graph.ainvoke({"question": question, "golden_answers": ["SARS"]}))


def environment_client(server: ScriptedServer) -> EnvironmentClient:
    return EnvironmentClient(EnvironmentConfig(model="env", base_url=server.base_url, max_retries=0))


def test_the_shipped_template_is_the_releases_file_byte_for_byte():
    text = release.chat_template().encode("utf-8")
    blob = hashlib.sha1(b"blob %d\0" % len(text) + text).hexdigest()  # git's id of the file's content
    assert blob == RELEASE_TEMPLATE_BLOB


def test_the_tokenizer_has_qwen3s_shape(qwen3_tokenizer):
    tok = qwen3_tokenizer
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for marker in ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>"):
        assert len(tok.encode(marker, add_special_tokens=False)) == 1, marker
    # <think> is added but not special: decoding without special tokens keeps it and drops <|im_end|>.
    assert (
        tok.decode(tok.encode("<think>x</think><|im_end|>"), skip_special_tokens=True) == "<think>x</think>"
    )


def two_turn_episode(tok, release_row) -> tuple[SampledIds, dict, list[dict]]:
    """TURN_1 (a call answered with REPLY) then TURN_2 (the answer): the agent, the final state, and the bodies
    the environment received."""
    agent = SampledIds(tok, [ids_of(tok, TURN_1), ids_of(tok, TURN_2)])
    with ScriptedServer({"env": lambda body: REPLY}) as server:
        state = run(
            agent,
            environment_client(server),
            LoopConfig(protocol="release", max_turn_tokens=64),
            extract_question(release_row["prompt"]),
        )
        return agent, state, [r.body for r in server.requests_for("env")]


def test_a_two_turn_episode_is_the_releases_stream_id_for_id(qwen3_tokenizer, release_row):
    tok = qwen3_tokenizer
    turn_1, turn_2 = ids_of(tok, TURN_1), ids_of(tok, TURN_2)
    agent, state, env_bodies = two_turn_episode(tok, release_row)

    # The release's stream from the same sampled ids.
    prompt = release_first_prompt(tok, release_row["prompt"])
    sent = []

    def execute(p: str) -> str:
        sent.append(p)
        return llm_tool_result(REPLY)

    observation = release_step(tok.decode(turn_1, skip_special_tokens=True), execute)
    observation_ids = tok(observation, add_special_tokens=False)["input_ids"]
    assert release_step(tok.decode(turn_2, skip_special_tokens=True), execute) is None  # no call: the end

    assert state["prompt_ids"] == prompt
    assert state["completion_ids"] == turn_1 + observation_ids + turn_2
    assert state["env_mask"] == [1] * len(turn_1) + [0] * len(observation_ids) + [1] * len(turn_2)
    assert state["logprobs"] == [-0.25] * len(turn_1) + [0.0] * len(observation_ids) + [-0.25] * len(turn_2)
    # Two end-of-turn tokens in a row after turn 1, and <think>\n prefilled before turn 2.
    assert state["completion_ids"][len(turn_1) - 1 : len(turn_1) + 1] == [tok.eos_token_id] * 2
    assert tok.decode(observation_ids).endswith("<|im_start|>assistant\n<think>\n")
    assert "\\u2014" in observation and "\\u949f" in observation  # JSON with non-ASCII escaped
    # What the agent was conditioned on, and that no stop string ended its turns.
    assert agent.requests[1].prompt_ids == prompt + turn_1 + observation_ids
    assert [r.stop for r in agent.requests] == [(), ()]
    # The environment: the system prompt with its trailing space, the prompt as sent, nothing else in the body.
    assert env_bodies[0]["messages"] == [
        {"role": "system", "content": LLM_TOOL_SYSTEM},
        {"role": "user", "content": sent[0]},
    ]
    assert not {"temperature", "max_tokens", "max_completion_tokens"} & set(env_bodies[0])
    assert state["status"] == "answered" and state["answer"] == "SARS"
    assert state["turns"][0]["response"] == REPLY.strip()
    assert state["turns"][1]["text"].startswith("<think>\nThe reply names it.")


def test_the_reward_scores_the_decoded_stream(qwen3_tokenizer, release_row):
    tok = qwen3_tokenizer
    _, state, _ = two_turn_episode(tok, release_row)
    ids = state["prompt_ids"] + state["completion_ids"]
    # agent_reward_manager.py: decode with special tokens, cut at padding, end with EOS.
    text = tok.decode(ids, skip_special_tokens=False).split(tok.decode([tok.pad_token_id]))[0]
    text = text if text.endswith(tok.eos_token) else text + tok.eos_token
    assert release.transcript(tok, ids) == text
    # The same text rebuilt from the turn records (what eval and chat-only episodes are scored on).
    assert release.stream_text(extract_question(release_row["prompt"]), state["turns"]) == text
    # compute_score_format_answer: turn 1 well formed (0.4), the answer turn (0.25 + 0.25 + 0.1), F1 1.
    assert score_transcript(text, ["SARS"], "release").total == pytest.approx(1.0)
    reward = trl_reward("release")
    columns = {
        "golden_answers": [["SARS"]] * 2,
        "transcript": [text] * 2,
        "ends_on_agent_token": [True, False],
    }
    assert reward(["q"] * 2, ["c"] * 2, **columns) == [pytest.approx(1.0), 0.0]


BAD_CALLS = [
    ("<interaction_prompt>Explain the question.</interaction_prompt>", "Error: JSONDecodeError"),
    (
        "<interaction_prompt>null</interaction_prompt>",
        "Error: JSONDecodeError",
    ),  # None stands for a failed parse
    ('<interaction_prompt>["prompt"]</interaction_prompt>', "Error: No tool name"),
    (
        '<interaction_prompt>"the name"</interaction_prompt>',
        "Error: No tool arguments",
    ),  # Python's `in` on a str
    ('<interaction_prompt>{"arguments": {"prompt": "x"}}</interaction_prompt>', "Error: No tool name"),
    ('<interaction_prompt>{"name": "prompt"}</interaction_prompt>', "Error: No tool arguments"),
    (
        '<interaction_prompt>{"name": "search", "arguments": {"prompt": "kept"}}</interaction_prompt>',
        "Error: ToolNotFoundError",
    ),
    (
        '<interaction_prompt>{"name": "prompt", "arguments": {"prompt": 3}}</interaction_prompt>',
        "Error: Invalid tool arguments",
    ),
    (
        '<interaction_prompt>{"name": "prompt", "arguments": {"query": "x"}}</interaction_prompt>',
        "Error: Invalid tool arguments",
    ),
]


@pytest.mark.parametrize("block,error", BAD_CALLS)
def test_a_malformed_call_is_answered_with_the_releases_error_and_the_episode_goes_on(
    qwen3_tokenizer, block, error
):
    tok = qwen3_tokenizer
    turn_1 = ids_of(tok, "<think>\nthink\n</think>\n" + block)
    turn_2 = ids_of(tok, "again</think>\n" + call("Second prompt"))
    turn_3 = ids_of(tok, "done</think>\n<answer>SARS</answer>")
    agent = SampledIds(tok, [turn_1, turn_2, turn_3])
    with ScriptedServer({"env": lambda body: "ok"}) as server:
        state = run(
            agent, environment_client(server), LoopConfig(protocol="release", max_turn_tokens=64), "Q?"
        )
        env_bodies = [r.body for r in server.requests_for("env")]

    observation = release_step(tok.decode(turn_1, skip_special_tokens=True), lambda p: pytest.fail("called"))
    assert error in observation
    first = tok(observation, add_special_tokens=False)["input_ids"]
    assert state["completion_ids"][: len(turn_1) + len(first)] == turn_1 + first
    assert state["turns"][0]["call_error"] == error and state["turns"][0]["response_source"] == "call_error"
    assert state["status"] == "answered" and len(state["turns"]) == 3
    # One environment call, turn 2's. The release's history keeps a bad call's arguments.prompt with an empty
    # reply (generation.py reads the reply from the observation's JSON, which an error text is not).
    assert len(env_bodies) == 1
    history = env_bodies[0]["messages"][1:-1]
    expected = {'{"arguments": {"prompt": "x"}}': "x", '"search", "arguments": {"prompt": "kept"}}': "kept"}
    expected = next((p for key, p in expected.items() if key in block), None)
    assert history == (
        [{"role": "user", "content": expected}, {"role": "assistant", "content": ""}] if expected else []
    )


def test_max_turns_counts_agent_turns_and_the_last_call_is_still_answered(qwen3_tokenizer):
    tok = qwen3_tokenizer
    turns = [ids_of(tok, "<think>\nt\n</think>\n" + call("p0"))] + [
        ids_of(tok, f"t{k}</think>\n" + call(f"p{k}")) for k in (1, 2)
    ]
    agent = SampledIds(tok, turns)
    with ScriptedServer({"env": lambda body: "r" + body["messages"][-1]["content"]}) as server:
        state = run(
            agent,
            environment_client(server),
            LoopConfig(protocol="release", max_turns=3, max_turn_tokens=64),
            "Q?",
        )
        env_bodies = [r.body for r in server.requests_for("env")]
    assert len(agent.requests) == 3 and len(env_bodies) == 3
    assert state["status"] == "max_turns" and state["answer"] is None
    # The episode ends on the environment's message: its reward is 0 (core_algos.py).
    assert state["env_mask"][-1] == 0
    ids = state["prompt_ids"] + state["completion_ids"]
    assert release.stream_text("Q?", state["turns"]) == release.transcript(tok, ids)
    assert release.episode_reward("Q?", state["turns"], ["a"]).total == 0.0
    # The history the third call saw: the earlier prompts and their stripped replies.
    assert env_bodies[2]["messages"][1:] == [
        {"role": "user", "content": "p0"},
        {"role": "assistant", "content": "rp0"},
        {"role": "user", "content": "p1"},
        {"role": "assistant", "content": "rp1"},
        {"role": "user", "content": "p2"},
    ]


def test_a_reply_over_2048_characters_is_cut_and_forgotten_by_the_history(qwen3_tokenizer):
    tok = qwen3_tokenizer
    long_reply = "word " * 600
    turns = [
        ids_of(tok, "<think>\nt\n</think>\n" + call("p0")),
        ids_of(tok, "t</think>\n" + call("p1")),
        ids_of(tok, "t</think>\n<answer>a</answer>"),
    ]
    with ScriptedServer({"env": lambda body: long_reply}) as server:
        state = run(
            SampledIds(tok, turns),
            environment_client(server),
            LoopConfig(protocol="release", max_turn_tokens=64),
            "Q?",
        )
        second = server.requests_for("env")[1].body["messages"]
    body = state["turns"][0]["observation"]
    assert (
        body
        == "<interaction_response>\n" + llm_tool_result(long_reply)[:2048] + "...\n</interaction_response>"
    )
    assert second[1:3] == [{"role": "user", "content": "p0"}, {"role": "assistant", "content": ""}]


@pytest.mark.parametrize("slack,status", [(0, "answered"), (-1, "context_overflow")])
def test_the_length_check_before_a_turn_is_the_releases(qwen3_tokenizer, slack, status):
    tok = qwen3_tokenizer
    turns = [ids_of(tok, "<think>\nt\n</think>\n" + call("p0")), ids_of(tok, "t</think>\n<answer>a</answer>")]
    with ScriptedServer({"env": lambda body: "r"}) as server:
        probe = run(
            SampledIds(tok, list(turns)),
            environment_client(server),
            LoopConfig(protocol="release", max_turn_tokens=64),
            "Q?",
        )
        before_turn_2 = len(probe["prompt_ids"]) + len(probe["completion_ids"]) - len(turns[1])
        loop = LoopConfig(protocol="release", max_turn_tokens=64, max_total_tokens=before_turn_2 + slack)
        state = run(SampledIds(tok, list(turns)), environment_client(server), loop, "Q?")
    # generation.py: a sample stops when its prompt + trajectory exceed max_prompt_length (>, not >=).
    assert state["status"] == status


def test_a_chat_only_agent_gets_the_same_message_texts(qwen3_tokenizer):
    from prompt_r1.agents.served import ServedAgent
    from prompt_r1.core.config import AgentConfig
    from prompt_r1.testing.servers import scripted_agent

    rendered = release.first_prompt_text(qwen3_tokenizer, "Q?")
    assert rendered.startswith("<|im_start|>system\n" + release.system_text() + "<|im_end|>\n")
    agent_turns = ["<think>t</think>" + call("p0") + "\nand after", "<think>u</think><answer>a</answer>"]
    with ScriptedServer({"env": lambda body: " r ", "agent": scripted_agent(agent_turns)}) as server:
        agent = ServedAgent(AgentConfig(model="agent", base_url=server.base_url, token_exact="off"))
        state = run(agent, environment_client(server), LoopConfig(protocol="release"), "Q?")
        second = server.requests_for("agent")[1].body
    assert state["status"] == "answered"
    assert second["messages"] == [
        {"role": "system", "content": release.system_text()},
        {"role": "user", "content": rendered.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]},
        {"role": "assistant", "content": agent_turns[0]},  # whole: the release cuts nothing after a tag
        {"role": "user", "content": '<interaction_response>\n{"results": ["r"]}\n</interaction_response>'},
    ]
    assert not second.get("stop")


def test_the_release_protocol_settings_are_checked():
    assert LoopConfig(protocol="release").force_final_answer is False
    assert LoopConfig().force_final_answer is True
    with pytest.raises(ConfigError, match="force_final_answer must be off"):
        LoopConfig(protocol="release", force_final_answer=True)
    with pytest.raises(ConfigError, match="protocol must be one of paper, release"):
        LoopConfig(protocol="verl")


def test_a_tokenizer_without_qwens_markers_is_refused(tiny_model_path):
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(
        tiny_model_path
    )  # the tiny models' own tokenizer has Qwen's markers
    release.check_tokenizer(plain)

    class NoMarkers:
        unk_token_id = pad_token_id = eos_token_id = None

        def encode(self, text, add_special_tokens=False):
            return list(text.encode())

    with pytest.raises(ConfigError, match="does not have <\\|im_end\\|> as one token"):
        release.check_tokenizer(NoMarkers())


def test_a_chat_only_turn_that_left_its_call_open_is_not_repaired(qwen3_tokenizer):
    """No stop strings are sent under the release protocol, so a turn that ends with an open call was not cut
    by the server: it has no call, and the episode ends there, as in the release."""
    from prompt_r1.agents.served import ServedAgent
    from prompt_r1.core.config import AgentConfig
    from prompt_r1.testing.servers import scripted_agent

    open_call = '<think>t</think><interaction_prompt>{"name": "prompt", "arguments": {"prompt": "p"}}'
    with ScriptedServer({"env": lambda body: "r", "agent": scripted_agent([open_call])}) as server:
        agent = ServedAgent(AgentConfig(model="agent", base_url=server.base_url, token_exact="off"))
        state = run(agent, environment_client(server), LoopConfig(protocol="release"), "Q?")
        assert not server.requests_for("env")
    assert state["status"] == "format_error" and state["turns"][0]["text"] == open_call


def test_a_refusal_gets_no_reward_under_the_release_rules():
    reward = trl_reward("release")
    columns = {"golden_answers": [["a"]] * 2, "transcript": ["x", "x"], "status": ["refused", "answered"]}
    assert reward(["q"] * 2, ["c"] * 2, **columns) == [None, -1.0]


def test_an_evaluation_folder_from_before_the_protocol_setting_resumes(tmp_path):
    from prompt_r1.evaluation.plan import MANIFEST, record_settings

    record_settings(tmp_path, ["prompt-r1"], loop=LoopConfig())
    manifest = tmp_path / MANIFEST
    written = json.loads(manifest.read_text())
    del written["methods"]["prompt-r1"]["loop"]["protocol"]  # as folders were written before it existed
    manifest.write_text(json.dumps(written))
    record_settings(tmp_path, ["prompt-r1"], loop=LoopConfig())  # the paper protocol: the same rows
    with pytest.raises(ConfigError, match="loop.protocol"):
        record_settings(tmp_path, ["prompt-r1"], loop=LoopConfig(protocol="release"))


def test_a_turn_that_ends_on_the_padding_token_loses_it_as_in_the_release(qwen3_tokenizer):
    """Qwen3's <|endoftext|> (its padding token) also ends a turn; the release drops padding ids from what was
    sampled (generation.py, _update_rolling_state), so the observation follows the turn's text directly."""
    tok = qwen3_tokenizer
    turn_1 = ids_of(tok, "<think>\nt\n</think>\n" + call("p0"), end=False) + [tok.pad_token_id]
    turn_2 = ids_of(tok, "t</think>\n<answer>a</answer>")
    with ScriptedServer({"env": lambda body: "r"}) as server:
        state = run(SampledIds(tok, [turn_1, turn_2]), environment_client(server),
                    LoopConfig(protocol="release", max_turn_tokens=64), "Q?")  # fmt: skip
    observation = tok(release.observation(release.reply_content("r")), add_special_tokens=False)["input_ids"]
    assert state["completion_ids"] == turn_1[:-1] + observation + turn_2
    assert len(state["logprobs"]) == len(state["completion_ids"])


def test_padding_in_a_reply_is_dropped_and_a_tokenizer_padding_with_its_end_of_turn_is_refused(
    qwen3_tokenizer,
):
    tok = qwen3_tokenizer
    turns = [ids_of(tok, "<think>\nt\n</think>\n" + call("p0")), ids_of(tok, "t</think>\n<answer>a</answer>")]
    with ScriptedServer({"env": lambda body: "a<|endoftext|>b"}) as server:
        state = run(SampledIds(tok, turns), environment_client(server),
                    LoopConfig(protocol="release", max_turn_tokens=64), "Q?")  # fmt: skip
    assert tok.pad_token_id not in state["completion_ids"]
    assert (
        "<|endoftext|>" in state["turns"][0]["observation"]
    )  # the text is kept; only the trajectory drops it

    class PadsWithEos:
        pad_token_id = eos_token_id = 7
        eos_token = "<|endoftext|>"

    with pytest.raises(ConfigError, match="pads with its end-of-sequence token"):
        release.check_tokenizer(PadsWithEos())


def test_eval_under_the_release_protocol_scores_the_stream(tmp_path):
    from prompt_r1.cli.main import main
    from prompt_r1.evaluation.harness import read_predictions
    from prompt_r1.testing.servers import scripted_agent

    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "q0", "question": "Q?", "golden_answers": ["Paris"]}) + "\n")
    turns = [f"<think>{k}</think>\n" + call(f"p{k}") for k in range(2)] + [
        "<think>v</think><answer>Paris</answer>"
    ]
    with ScriptedServer({"env": lambda body: "Paris.", "agent": scripted_agent(turns)}) as server:
        flags = ["--env-model", "env", "--env-base-url", server.base_url, "--agent-model", "agent",
                 "--agent-base-url", server.base_url, "--agent-token-exact", "off", "--no-progress"]  # fmt: skip
        code = main(["eval", "--dataset", str(data), "--method", "prompt-r1", "--protocol", "release",
                     "--out", str(tmp_path / "out"), *flags])  # fmt: skip
    assert code == 0
    (row,) = read_predictions(tmp_path / "out" / "predictions.jsonl")
    assert row["status"] == "answered" and row["prediction"] == "Paris"
    # The chat-only turns rebuilt into the release's stream, each turn's own <think> in the prefill's place:
    # both calls well formed (0.4 each), the answer turn complete (0.6), capped at 1; the answer right (1).
    assert row["reward"]["release"] == pytest.approx(1.0)
    # The two calls alone: each well formed, the second too, though its agent wrote its own <think> (0.4 each).
    assert release.episode_reward("Q?", row["turns"][:2], ["Paris"]).format_reward == pytest.approx(0.8)
