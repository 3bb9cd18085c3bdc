"""Agent backends: the local transformers model (tiny, built and trained in-process), the served agent, vLLM."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util

import pytest
from conftest import TINY_QUESTION, TINY_RESPONSE_1, TINY_TURN_1, TINY_TURN_2

from prompt_r1.agents import AgentRequest, load_agent
from prompt_r1.agents.base import AgentOutput
from prompt_r1.agents.batching import BatchingBackend
from prompt_r1.agents.local import TransformersAgent
from prompt_r1.agents.served import ServedAgent
from prompt_r1.clients.environment import EnvironmentClient
from prompt_r1.core.config import AgentConfig, EnvironmentConfig, LoopConfig
from prompt_r1.core.errors import BackendUnavailable, ConfigError
from prompt_r1.core.prompts import question_message
from prompt_r1.core.tokens import initial_prompt_ids, user_turn_ids
from prompt_r1.loop.graph import build_graph
from prompt_r1.testing.servers import ScriptedServer, echo_environment


def greedy(path, **kw) -> TransformersAgent:
    return TransformersAgent(AgentConfig(model=str(path), temperature=0.0, max_new_tokens=64, **kw))


def env_client(server) -> EnvironmentClient:
    return EnvironmentClient(EnvironmentConfig(model="env", base_url=server.base_url), api_key="k")


def test_local_agent_runs_the_loop_with_a_token_exact_trajectory(trained_tiny_model_path):
    agent = greedy(trained_tiny_model_path)
    tok = agent.tokenizer
    with ScriptedServer({"env": echo_environment()}) as server:
        result = build_graph(agent, env_client(server)).invoke({"question": TINY_QUESTION})

    assert result["status"] == "answered" and result["answer"] == "Ada Lovelace"
    assert [t["kind"] for t in result["turns"]] == ["prompt", "answer"]
    assert result["turns"][0]["response"] == TINY_RESPONSE_1
    # Both turns ended on their stop strings (</interaction_prompt>, then </answer>), before any EOS.
    assert [t["finish_reason"] for t in result["turns"]] == ["stop", "stop"]

    prompt = initial_prompt_ids(tok, [{"role": "user", "content": question_message(TINY_QUESTION)}])
    turn1 = tok.encode(TINY_TURN_1, add_special_tokens=False)
    env = user_turn_ids(tok, f"<interaction_response>{TINY_RESPONSE_1}</interaction_response>", turn1)
    turn2 = tok.encode(TINY_TURN_2, add_special_tokens=False)
    assert result["prompt_ids"] == prompt
    assert result["completion_ids"] == turn1 + env + turn2
    assert result["env_mask"] == [1] * len(turn1) + [0] * len(env) + [1] * len(turn2)
    assert len(result["logprobs"]) == len(result["completion_ids"])
    agent_logprobs = [lp for lp, m in zip(result["logprobs"], result["env_mask"], strict=True) if m]
    env_logprobs = [lp for lp, m in zip(result["logprobs"], result["env_mask"], strict=True) if not m]
    assert all(lp <= 0.0 for lp in agent_logprobs) and all(lp == 0.0 for lp in env_logprobs)
    assert sum(agent_logprobs) / len(agent_logprobs) > -0.5  # the trained model is confident in its script
    # Decoding the trajectory gives the episode's text: nothing was re-rendered.
    text = tok.decode(result["completion_ids"])
    assert text.startswith(TINY_TURN_1 + "<|im_end|>\n<|im_start|>user\n<interaction_response>")
    assert text.endswith("<|im_start|>assistant\n" + TINY_TURN_2)


async def test_concurrent_episodes_share_one_generate_call(trained_tiny_model_path):
    agent = greedy(trained_tiny_model_path)
    with ScriptedServer({"env": echo_environment()}) as server:
        graph = build_graph(agent, env_client(server))
        results = await asyncio.gather(*(graph.ainvoke({"question": TINY_QUESTION}) for _ in range(6)))
    assert all(r["answer"] == "Ada Lovelace" for r in results)
    assert sum(agent.batches) == 12  # 6 episodes × 2 agent turns
    assert max(agent.batches) == 6  # the first turns of all six episodes went out as one batch
    assert len({tuple(r["completion_ids"]) for r in results}) == 1  # batching (left padding) changed nothing


async def test_per_turn_budget_ends_with_format_error(tiny_model_path):
    agent = greedy(tiny_model_path)
    out = await agent.generate(
        AgentRequest(messages=[{"role": "user", "content": "hi"}], max_new_tokens=5, stop=())
    )
    assert out.finish_reason == "length" and len(out.token_ids) == 5 == len(out.logprobs)
    with ScriptedServer({"env": echo_environment()}) as server:
        result = build_graph(agent, env_client(server), loop=LoopConfig(max_turn_tokens=8)).invoke(
            {"question": "Q?"}
        )
    assert result["status"] == "format_error"
    assert len(result["completion_ids"]) == 8


def test_trajectory_budget_ends_with_context_overflow(trained_tiny_model_path):
    agent = greedy(trained_tiny_model_path)
    turn1_len = len(agent.tokenizer.encode(TINY_TURN_1, add_special_tokens=False))
    with ScriptedServer({"env": echo_environment()}) as server:
        graph = build_graph(agent, env_client(server), loop=LoopConfig(max_total_tokens=turn1_len + 10))
        result = graph.invoke({"question": TINY_QUESTION})
    assert result["status"] == "context_overflow"
    assert len(server.requests_for("env")) == 1  # the first turn fitted and was answered


async def test_served_agent_restores_the_stop_sequence():
    script = "<think>t</think><interaction_prompt>ask</interaction_prompt><interaction_response>made up"
    with ScriptedServer({"agent": lambda body: script}) as server:
        agent = ServedAgent(AgentConfig(model="agent", base_url=server.base_url), api_key="k")
        out = await agent.generate(AgentRequest(messages=[{"role": "user", "content": "q"}]))
        assert out.text == "<think>t</think><interaction_prompt>ask</interaction_prompt>"
        assert out.token_ids is None and out.completion_tokens > 0
        assert server.requests[-1].body["max_tokens"] == 1024


def test_load_agent_picks_the_backend(tiny_model_path):
    assert isinstance(load_agent(AgentConfig(model=str(tiny_model_path))), TransformersAgent)
    assert isinstance(load_agent(AgentConfig(model="m", base_url="http://127.0.0.1:1/v1")), ServedAgent)


def test_unloadable_model_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="--agent-model"):
        load_agent(AgentConfig(model="no-org/no-such-model-anywhere"))


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_backend_without_the_extra_names_it():
    with pytest.raises(BackendUnavailable, match=r"prompt-r1\[vllm\]"):
        load_agent(AgentConfig(model="m", backend="vllm"))


@pytest.mark.vllm
@pytest.mark.gpu
def test_vllm_backend_runs_the_loop(trained_tiny_model_path):
    pytest.importorskip("vllm")
    agent = load_agent(AgentConfig(model=str(trained_tiny_model_path), backend="vllm", temperature=0.0))
    with ScriptedServer({"env": echo_environment()}) as server:
        result = build_graph(agent, env_client(server)).invoke({"question": TINY_QUESTION})
    assert result["answer"] == "Ada Lovelace"
    assert len(result["logprobs"]) == len(result["completion_ids"])


def test_user_turn_ids_skip_an_end_of_turn_the_agent_already_sampled(tiny_model_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    ids = user_turn_ids(tok, "hello", [5, 6])
    assert tok.decode(ids) == "<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert user_turn_ids(tok, "hello", [5, im_end]) == ids[1:]


def test_opening_ids_are_rendered_once_per_conversation_and_handed_out_as_new_lists(tiny_model_path):
    """A GRPO group opens every episode on the same messages: rendered and tokenised once, each caller getting
    its own list (a caller that appends to it changes nothing for the next)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    messages = [{"role": "user", "content": question_message("Who?")}]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    first = initial_prompt_ids(tok, messages)
    assert tok.decode(first) == rendered
    first.append(7)
    calls = []
    original = tok.apply_chat_template
    tok.apply_chat_template = lambda *a, **k: calls.append(1) or original(*a, **k)
    again = initial_prompt_ids(tok, [dict(m) for m in messages])
    assert tok.decode(again) == rendered and calls == []  # from the cache, unchanged by the append
    other = initial_prompt_ids(tok, [{"role": "user", "content": question_message("Where?")}])
    assert calls == [1] and other != again


# Like Qwen3's template, this one drops the <think> block of assistant turns before the last user message, so a
# re-rendered conversation no longer matches what the agent sampled.
THINK_DROPPING_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}"
    "{%- for m in messages %}{%- set content = m.content %}"
    "{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1] %}{%- endif %}"
    "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def test_trajectory_keeps_what_was_sampled_where_re_rendering_drifts(trained_tiny_model_path):
    agent = greedy(trained_tiny_model_path)
    agent.tokenizer.chat_template = THINK_DROPPING_TEMPLATE
    with ScriptedServer({"env": echo_environment()}) as server:
        result = build_graph(agent, env_client(server)).invoke({"question": TINY_QUESTION})
    assert result["answer"] == "Ada Lovelace"
    kept = agent.tokenizer.decode(result["prompt_ids"] + result["completion_ids"])
    assert "<think>a person</think>" in kept
    conversation = [
        {"role": "user", "content": question_message(TINY_QUESTION)},
        {"role": "assistant", "content": TINY_TURN_1},
        {"role": "user", "content": f"<interaction_response>{TINY_RESPONSE_1}</interaction_response>"},
    ]
    re_rendered = agent.tokenizer.apply_chat_template(
        conversation, tokenize=False, add_generation_prompt=True
    )
    assert "<think>a person</think>" not in re_rendered  # what re-rendering would have trained on instead
    assert kept.startswith(
        re_rendered.replace(
            "<|im_start|>assistant\n<interaction_prompt>",
            "<|im_start|>assistant\n<think>a person</think><interaction_prompt>",
        )
    )


def test_the_drift_check_says_when_re_rendering_changes_what_the_agent_read(trained_tiny_model_path):
    from prompt_r1.agents.vllm_server import rendering_drift

    agent = greedy(trained_tiny_model_path)
    with ScriptedServer({"env": echo_environment()}) as server:
        result = build_graph(agent, env_client(server)).invoke({"question": TINY_QUESTION})
    plain = rendering_drift(agent.tokenizer, result)
    assert plain["differs"] is False  # the plain template renders every turn as it was sampled
    agent.tokenizer.chat_template = THINK_DROPPING_TEMPLATE
    dropped = rendering_drift(agent.tokenizer, result)
    assert dropped["differs"] is True and dropped["first_difference"] > len(result["prompt_ids"])
    # The rebuild from turn texts is as long as the token-exact trajectory the episode kept.
    assert plain["tokens"][1] == len(result["prompt_ids"]) + len(result["completion_ids"])


def test_a_served_agent_elsewhere_than_vllm_keeps_chat_messages_and_says_why(trained_tiny_model_path):
    from prompt_r1.agents.served import ServedAgent

    with ScriptedServer({"agent": echo_environment()}) as server:
        config = AgentConfig(model="agent", base_url=server.base_url, tokenizer=str(trained_tiny_model_path))
        agent = ServedAgent(config, api_key="unused-key")
        assert agent.tokenizer is None and agent.drift_tokenizer is not None
        assert "not a vLLM server" in agent.token_exact
        with pytest.raises(ConfigError, match="--agent-token-exact on: the served agent at .* is not a vLLM"):
            ServedAgent(dataclasses.replace(config, token_exact="on"), api_key="unused-key")


def test_a_served_agent_on_vllm_finds_its_tokenizer_where_the_server_loaded_the_model(
    trained_tiny_model_path,
):
    from transformers import AutoTokenizer

    from prompt_r1.agents.served import ServedAgent

    tokenizer = AutoTokenizer.from_pretrained(trained_tiny_model_path)
    playing_vllm = dict(tokenizer=tokenizer, vllm_version="0.31.0")
    roots = {"agent": str(trained_tiny_model_path)}
    exact = dict(model="agent", token_exact="on")
    with ScriptedServer({"agent": echo_environment()}, model_roots=roots, **playing_vllm) as server:
        agent = ServedAgent(AgentConfig(base_url=server.base_url, **exact), api_key="unused-key")
        assert agent.tokenizer is not None and "completions API" in agent.token_exact
        assert agent.tokenizer.chat_template == tokenizer.chat_template
        # Without `on` nothing is asked at start (no request while the agent is built): chat messages.
        sent = len(server.version_headers)
        auto = ServedAgent(AgentConfig(model="agent", base_url=server.base_url), api_key="unused-key")
        assert auto.tokenizer is None and "--agent-token-exact on" in auto.token_exact
        assert len(server.version_headers) == sent
    no_root = ScriptedServer({"agent": echo_environment()}, **playing_vllm)
    with no_root as server, pytest.raises(ConfigError, match="--agent-token-exact on: no tokenizer .*"):
        ServedAgent(AgentConfig(base_url=server.base_url, **exact), api_key="unused-key")
    old = dict(playing_vllm, vllm_version="0.10.1.1")  # before return_token_ids
    with ScriptedServer({"agent": echo_environment()}, model_roots=roots, **old) as server:
        config = AgentConfig(model="agent", base_url=server.base_url, tokenizer=str(trained_tiny_model_path))
        agent = ServedAgent(config, api_key="unused-key")
    assert agent.tokenizer is None and "vLLM 0.10.1.1 returns no token ids" in agent.token_exact


def test_per_turn_cap_defaults_to_the_agent_config(tiny_model_path):
    """Without max_new_tokens, a turn is capped by AgentConfig.max_new_tokens, not by the trajectory budget."""
    agent = TransformersAgent(AgentConfig(model=str(tiny_model_path), temperature=0.0, max_new_tokens=5))
    with ScriptedServer({"env": echo_environment()}) as server:
        result = build_graph(agent, env_client(server), loop=LoopConfig(max_total_tokens=60)).invoke(
            {"question": "Q?"}
        )
    assert result["status"] == "format_error"  # a turn cut by its own cap is malformed, not an overflow
    assert len(result["completion_ids"]) == 5


@pytest.mark.parametrize("spare", [10, 3])
def test_trajectory_never_exceeds_its_budget(trained_tiny_model_path, spare):
    """spare=10: turn 1 fits, the environment's message does not; spare=3 likewise. Either way the trajectory
    ends after the agent's turn and never holds more than max_total_tokens."""
    agent = greedy(trained_tiny_model_path)
    budget = len(agent.tokenizer.encode(TINY_TURN_1, add_special_tokens=False)) + spare
    with ScriptedServer({"env": echo_environment()}) as server:
        result = build_graph(agent, env_client(server), loop=LoopConfig(max_total_tokens=budget)).invoke(
            {"question": TINY_QUESTION}
        )
    assert result["status"] == "context_overflow"
    assert len(result["completion_ids"]) <= budget
    assert set(result["env_mask"]) == {1}  # no cut-off environment message was appended


async def test_rows_only_stop_on_their_own_stop_strings(trained_tiny_model_path):
    agent = greedy(trained_tiny_model_path)
    messages = [{"role": "user", "content": question_message(TINY_QUESTION)}]
    free = AgentRequest(messages=messages, max_new_tokens=30, stop=())
    solo = await agent.generate(free)
    stopped, unstopped = await asyncio.gather(
        agent.generate(AgentRequest(messages=messages)), agent.generate(free)
    )
    assert stopped.text == TINY_TURN_1 and stopped.finish_reason == "stop"
    assert unstopped.token_ids == solo.token_ids and unstopped.finish_reason == solo.finish_reason


async def test_left_padding_does_not_change_what_a_row_generates(trained_tiny_model_path):
    agent = greedy(trained_tiny_model_path)
    requests = [
        AgentRequest(
            messages=[{"role": "user", "content": question_message(TINY_QUESTION)}], max_new_tokens=12
        ),
        AgentRequest(messages=[{"role": "user", "content": "short"}], max_new_tokens=12),
    ]
    solo = [await agent.generate(r) for r in requests]
    together = await asyncio.gather(*(agent.generate(r) for r in requests))
    assert agent.batches[-1] == 2
    for a, b in zip(solo, together, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_one_agent_serves_two_event_loops_at_once(trained_tiny_model_path):
    """graph.invoke (the background loop) and asyncio.run(graph.ainvoke) (another loop) share one local agent."""
    import threading

    agent = greedy(trained_tiny_model_path)
    with ScriptedServer({"env": echo_environment()}) as server:
        graph = build_graph(agent, env_client(server))
        results: dict[str, dict] = {}
        sync = threading.Thread(target=lambda: results.update(sync=graph.invoke({"question": TINY_QUESTION})))
        sync.start()
        results["async"] = asyncio.run(asyncio.wait_for(graph.ainvoke({"question": TINY_QUESTION}), 60))
        sync.join(60)
    assert results["sync"]["answer"] == results["async"]["answer"] == "Ada Lovelace"


class _TimedBackend(BatchingBackend):
    """A batching backend whose every generate call costs a fixed time, whatever its size: what a decoding pass
    on an accelerator costs. It answers each row with its own prompt, so callers can check what they got."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def _generate_locked(self, batch):
        import time

        time.sleep(self.seconds)
        return [
            AgentOutput(text=str(item.prompt_ids[0]), token_ids=[], logprobs=[], finish_reason="stop")
            for item in batch
        ]


async def _staggered_turns(backend, delays, *, register: bool) -> list[str]:
    """Each episode asks once together (turn 1), then again after its own 'environment' delay (turn 2)."""

    async def episode(i: int, delay: float) -> str:
        with backend.episode() if register else contextlib.nullcontext():
            await backend.generate(AgentRequest(messages=[], prompt_ids=[i], max_new_tokens=4))
            with backend.away():  # the environment's call, as the loop marks it
                await asyncio.sleep(delay)
            out = await backend.generate(AgentRequest(messages=[], prompt_ids=[i], max_new_tokens=4))
            return out.text

    return await asyncio.gather(*(episode(i, d) for i, d in enumerate(delays)))


async def test_registered_episodes_join_one_batch_when_their_turns_arrive_apart():
    delays = [0.0, 0.01, 0.02, 0.03, 0.04, 0.05]  # environment replies landing tens of ms apart
    registered = _TimedBackend(0.2)
    assert await _staggered_turns(registered, delays, register=True) == [str(i) for i in range(6)]
    assert registered.batches == [6, 6]  # the second turn waited for every live episode: one call, not six
    unregistered = _TimedBackend(0.2)  # the control: without registration each arrival makes its own call
    await _staggered_turns(unregistered, delays, register=False)
    assert len(unregistered.batches) > 2


async def test_a_straggling_episode_does_not_hold_the_batch_past_the_wait():
    import time

    backend = _TimedBackend(0.1)
    start = time.monotonic()
    await _staggered_turns(backend, [0.0, 0.0, 0.0, 3.0], register=True)
    # Turn 2 of the three quick episodes waited at most batch_wait x 0.1 s for the fourth, then went without it.
    assert backend.batches == [4, 3, 1]
    assert time.monotonic() - start < 3.0 + 4 * 0.1 + 0.5


async def _ask(backend, i: int) -> float:
    """One request of episode `i`; the time its generate call started (the batch it rode in)."""
    await backend.generate(AgentRequest(messages=[], prompt_ids=[i], max_new_tokens=4))
    return backend.started[-1]


class _StartTimes(_TimedBackend):
    def _generate_locked(self, batch):
        import time

        self.started = getattr(self, "started", []) + [time.monotonic()]
        return super()._generate_locked(batch)


async def test_a_turn_waits_for_every_episode_on_its_way_with_no_timer():
    """Episodes between their environment reply and their request (the loop's parsing and tokenising, spread over
    passes of the event loop) are waited for however long the timer would be: each turn is one generate call that
    starts the moment the last of them asks. Turn 1 too, before any generate call was timed."""
    backend = _TimedBackend(0.05)  # the timer's bound would be 0.5 x 0.05 s: shorter than the loop work below

    async def episode(i: int) -> None:
        with backend.episode():
            for _ in range(i):  # reaching the first request takes some episodes several passes
                await asyncio.sleep(0)
            await backend.generate(AgentRequest(messages=[], prompt_ids=[i], max_new_tokens=4))
            with backend.away():
                await asyncio.sleep(0.01)
            # The loop's own work on the reply: up to 90 ms, not at the environment.
            await asyncio.sleep(0.03 * i)
            await backend.generate(AgentRequest(messages=[], prompt_ids=[i], max_new_tokens=4))

    await asyncio.gather(*(episode(i) for i in range(4)))
    assert backend.batches == [4, 4]


async def test_a_turn_starts_at_once_when_every_live_episode_has_asked_or_ended():
    """No timer when the count is known: with a wait bound of 100 generate calls, a turn whose live episodes have
    all asked (one ended after its first turn) starts at once."""
    import time

    backend = _StartTimes(0.02)
    backend.batch_wait = 100.0

    async def episode(i: int) -> float | None:
        with backend.episode():
            await _ask(backend, i)
            if i == 3:
                return None  # answered at its first turn
            with backend.away():
                await asyncio.sleep(0.01)
            asked = time.monotonic()
            started = await _ask(backend, i)
            return started - asked

    waits = await asyncio.gather(*(episode(i) for i in range(4)))
    assert backend.batches == [4, 3]
    assert max(w for w in waits if w is not None) < 0.5, waits


async def test_an_episode_at_the_environment_holds_the_batch_only_within_the_bound():
    """The one count the batcher cannot know: when an episode at the environment answers. With batch_wait 0 it
    holds nothing; by default at most batch_wait x a recent generate call, however long its reply takes."""
    import time

    for wait, bound in ((0.0, 0.0), (0.5, 0.5 * 0.1)):
        backend = _StartTimes(0.1)
        backend.batch_wait = wait
        replied: dict[int, float] = {}

        async def episode(i: int, backend=backend, replied=replied) -> float:
            with backend.episode():
                await _ask(backend, i)
                with backend.away():
                    await asyncio.sleep(1.0 if i == 3 else 0.0)
                replied[i] = time.monotonic()
                return await _ask(backend, i)

        started = await asyncio.gather(*(episode(i) for i in range(4)))
        assert backend.batches == [4, 3, 1]
        held = started[0] - max(replied[i] for i in range(3))
        assert held < bound + 0.2 and started[0] < replied[3], (wait, held)


async def test_lockstep_batches_wait_for_every_episode_and_keep_episode_order():
    class Recording(_TimedBackend):
        def _generate_locked(self, batch):
            self.rows = getattr(self, "rows", []) + [[item.key for item in batch]]
            return super()._generate_locked(batch)

    async def run(delays):
        backend = Recording(0.01)
        backend.lockstep = True

        async def episode(i: int, delay: float) -> None:
            with backend.episode(i):
                await asyncio.sleep(delay / 2)
                await backend.generate(AgentRequest(messages=[], prompt_ids=[i], max_new_tokens=4))
                await asyncio.sleep(delay)  # the environment's reply: later for the lower indices here
                await backend.generate(AgentRequest(messages=[], prompt_ids=[i], max_new_tokens=4))

        await asyncio.gather(*(episode(i, d) for i, d in enumerate(delays)))
        return backend.rows

    # Replies in reverse order, then shuffled, then with a straggler: the same two batches, in episode order.
    expected = [[(i, 0) for i in range(4)], [(i, 1) for i in range(4)]]
    assert await run([0.08, 0.06, 0.04, 0.02]) == expected
    assert await run([0.02, 0.08, 0.04, 0.06]) == expected
    assert (
        await run([0.0, 0.0, 0.3, 0.0]) == expected
    )  # the straggler is waited for, not left to a batch of one


async def test_each_generate_calls_seconds_are_shared_among_the_turns_it_served():
    """The step line's generation by turn: a call's seconds go to the turns of its rows, in proportion (a row of
    no known turn keeps its share under None), and the shares add up to the calls' seconds."""
    backend = _TimedBackend(0.05)
    turns = [0, 0, 1, None]
    await asyncio.gather(
        *(
            backend.generate(AgentRequest(messages=[], prompt_ids=[i], max_new_tokens=4, turn=turn))
            for i, turn in enumerate(turns)
        )
    )
    assert backend.batches == [4]
    split = backend.generate_turn_s
    assert split[0] == pytest.approx(2 * split[1]) and split[1] == pytest.approx(split[None]) and split[1] > 0
    assert sum(split.values()) == pytest.approx(backend.generate_total_s)


def test_a_grouped_query_models_padded_batch_decodes_the_same_with_its_groups_uncopied(
    tiny_model_path, tmp_path, monkeypatch
):
    """On CPU the loader gives a grouped-query model (the tiny model: 4 query heads over 2 key/value heads) the
    attention that hands the kernel its groups together with the padding mask (agents/attention.py): rows of
    different lengths decode greedily to the same tokens and scores as under transformers' SDPA attention, which
    copies the groups first. A model without groups is left as it is."""
    import torch

    from prompt_r1.agents.attention import NAME, use_grouped_attention
    from prompt_r1.testing.tiny_models import build_tiny_model

    agent = TransformersAgent(AgentConfig(model=str(tiny_model_path), temperature=0.0, device="cpu"))
    model, tokenizer = agent.model, agent.tokenizer
    assert model.config._attn_implementation == NAME
    tokenizer.padding_side = "left"
    texts = ["a", "where was the builder of the bridge born?", "who built it " * 9, "tell me " * 20]
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    assert not batch["attention_mask"].all()  # padded: the mask the copies were made for

    kernel = torch.nn.functional.scaled_dot_product_attention
    calls = []

    def spied(*args, **kwargs):  # the kernel's calls: with their groups uncopied, and with a mask
        calls.append((kwargs.get("enable_gqa", False), kwargs.get("attn_mask") is not None, args[1].shape[1]))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spied)

    def decoded():
        calls.clear()
        out = model.generate(**batch, max_new_tokens=12, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        return out.sequences, torch.stack(out.scores), list(calls)

    grouped = decoded()
    model.set_attn_implementation("sdpa")
    plain = decoded()
    assert torch.equal(grouped[0], plain[0]) and torch.equal(grouped[1], plain[1])
    # Every call of the grouped form passed the 2 key/value heads and the mask; transformers' copied them to 4.
    assert grouped[2] and set(grouped[2]) == {(True, True, 2)}
    assert plain[2] and set(plain[2]) == {(False, True, 4)}
    assert use_grouped_attention(model) and model.config._attn_implementation == NAME
    ungrouped = TransformersAgent(
        AgentConfig(model=str(build_tiny_model(tmp_path / "mha", kv_heads=4)), temperature=0.0, device="cpu")
    )
    assert ungrouped.model.config._attn_implementation == "sdpa"


def test_the_grouped_attention_is_the_rollouts_only(tiny_model_path):
    """A policy generates its rollouts with the grouped attention and trains with its own: the block switches it
    and switches it back, also when the block fails."""
    from transformers import AutoModelForCausalLM

    from prompt_r1.agents.attention import NAME, grouped_attention_while

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path)
    assert model.config._attn_implementation == "sdpa"
    with grouped_attention_while(model):
        assert model.config._attn_implementation == NAME
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="a failed rollout"), grouped_attention_while(model):
        raise RuntimeError("a failed rollout")
    assert model.config._attn_implementation == "sdpa"
    model.set_attn_implementation("eager")  # not SDPA: left as it is
    with grouped_attention_while(model):
        assert model.config._attn_implementation == "eager"
