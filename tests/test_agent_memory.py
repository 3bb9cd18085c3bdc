"""What bounds the memory of local training and generation: the agent's memory bound per generate call, its
log-probabilities taken one step at a time, and the cold start's micro-batches."""

from __future__ import annotations

import asyncio

import pytest
import torch
from conftest import TINY_QUESTION

from prompt_r1.agents import AgentRequest
from prompt_r1.agents.local import CPU_BATCH_BYTES, TransformersAgent, generate_bytes_per_token
from prompt_r1.core.config import AgentConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.core.prompts import question_message
from prompt_r1.core.tokens import initial_prompt_ids

MESSAGES = [{"role": "user", "content": question_message(TINY_QUESTION)}]


def greedy(path, **kw) -> TransformersAgent:
    config = AgentConfig(model=str(path), temperature=0.0, max_new_tokens=64, device="cpu")
    return TransformersAgent(config, **kw)


def counting_generate(agent: TransformersAgent) -> list[int]:
    """The rows of each real `model.generate` call the agent makes, recorded as it makes them."""
    rows: list[int] = []
    real = agent.model.generate

    def generate(*args, **kwargs):
        rows.append(kwargs["input_ids"].shape[0])
        return real(*args, **kwargs)

    agent.model.generate = generate
    return rows


async def test_a_batch_over_the_memory_bound_runs_as_calls_that_fit_and_answers_as_one_call(
    trained_tiny_model_path,
):
    unbounded = greedy(trained_tiny_model_path, max_batch_bytes=1 << 40)
    prompt = len(initial_prompt_ids(unbounded.tokenizer, MESSAGES))
    budgets = [12, 5, 12, 8, 3]  # different rows, so that an answer given to the wrong request shows
    requests = [AgentRequest(messages=MESSAGES, max_new_tokens=n, stop=()) for n in budgets]
    whole = await asyncio.gather(*(unbounded.generate(r) for r in requests))
    assert [len(out.token_ids) for out in whole] == budgets
    row = (prompt + 12) * unbounded.cache_bytes + 12 * unbounded.score_bytes
    bounded = greedy(trained_tiny_model_path, max_batch_bytes=2 * row)
    calls = counting_generate(bounded)
    split = await asyncio.gather(*(bounded.generate(r) for r in requests))
    assert unbounded.batches == [5] and bounded.batches == [5]  # one batch of the drainer...
    assert calls == [2, 2, 1]  # ...run as calls of at most two rows of 12 new tokens
    for a, b in zip(whole, split, strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_each_row_pays_the_longest_prompt_the_most_new_tokens_and_a_score_row_per_new_token(tiny_model_path):
    from prompt_r1.agents.batching import PendingRequest

    agent = greedy(tiny_model_path, max_batch_bytes=95)

    def runs(*shapes):
        rows = [PendingRequest([0] * p, n, (), None, None, False, None) for p, n in shapes]
        return [[(len(r.prompt_ids), r.max_new_tokens) for r in run] for run in agent._fitting(rows)]

    shapes = ((30, 10), (20, 10), (40, 5), (10, 10), (90, 10), (5, 5))
    agent.cache_bytes, agent.score_bytes = 1, 0  # a byte a token: the padded tokens alone
    # (30 + 10) x 2 = 80 fits; a third row, (40 + 10) x 3 = 150, does not; (40 + 10) x 2 = 100 for the next
    # pair does not either; a row of 90 + 10 is over the bound alone and still runs, by itself.
    assert runs(*shapes) == [[(30, 10), (20, 10)], [(40, 5)], [(10, 10)], [(90, 10)], [(5, 5)]]
    agent.score_bytes = 1  # and a byte a score row: (30 + 10 + 10) x 2 = 100 no longer fits
    assert runs(*shapes)[:2] == [[(30, 10)], [(20, 10)]]


def test_the_estimate_reads_the_models_shape(tiny_model_path):
    agent = greedy(tiny_model_path)
    config = agent.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    cache = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4  # float32
    assert generate_bytes_per_token(agent.model) == (cache, 4 * config.vocab_size)


def test_the_bound_defaults_to_the_cpu_figure_on_cpu_and_refuses_nonsense(tiny_model_path):
    assert greedy(tiny_model_path).max_batch_bytes == CPU_BATCH_BYTES
    with pytest.raises(ConfigError, match="max_batch_bytes must be at least 1"):
        greedy(tiny_model_path, max_batch_bytes=-5)


def test_the_bound_is_set_from_the_config_the_flag_and_the_model_servers_flag(tiny_model_path):
    from prompt_r1.cli.flags import configs_from_args
    from prompt_r1.cli.main import build_parser

    config = AgentConfig(model=str(tiny_model_path), temperature=0.0, device="cpu", generate_memory_mb=3)
    assert TransformersAgent(config).max_batch_bytes == 3 << 20
    assert TransformersAgent(config, max_batch_bytes=7).max_batch_bytes == 7  # the caller's own wins
    with pytest.raises(ConfigError, match="generate_memory_mb"):
        AgentConfig(generate_memory_mb=0)
    parser = build_parser()
    args = parser.parse_args(
        ["run", "q", "--agent-model", str(tiny_model_path), "--agent-generate-memory-mb", "5"]
    )
    assert configs_from_args(args)[0].generate_memory_mb == 5
    assert parser.parse_args(["serve-model", "m", "--generate-memory-mb", "9"]).generate_memory_mb == 9
    with pytest.raises(SystemExit):
        parser.parse_args(["serve-model", "m", "--generate-memory-mb", "0"])
    from prompt_r1.agents.model_server import load_served_model

    server = load_served_model(str(tiny_model_path), temperature=0.0, generate_memory_mb=2)
    assert server.generator(0.0, 1.0).max_batch_bytes == server.generator(0.5, 1.0).max_batch_bytes == 2 << 20


async def test_each_tokens_logprob_is_its_log_softmax_under_the_model(trained_tiny_model_path):
    agent = greedy(trained_tiny_model_path)
    prompt = initial_prompt_ids(agent.tokenizer, MESSAGES)
    out = await agent.generate(AgentRequest(messages=MESSAGES, max_new_tokens=12, stop=()))
    assert len(out.token_ids) == len(out.logprobs) > 1
    with torch.no_grad():
        logits = agent.model(torch.tensor([list(prompt) + out.token_ids])).logits[0].float()
    expected = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
    expected = expected.gather(1, torch.tensor(out.token_ids)[:, None]).squeeze(1)
    assert out.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


def test_the_cold_starts_micro_batches_take_the_step_the_whole_batch_would(tiny_model_path, tmp_path):
    from prompt_r1.tasks.notes_agent import cold_start

    losses: dict[int, list[float]] = {}
    for micro in (8, 3, 1):
        said: list[str] = []
        cold_start(tmp_path / str(micro), steps=2, episodes=16, micro_batch=micro, base=str(tiny_model_path),
                   say=said.append)  # fmt: skip
        losses[micro] = [float(line.rsplit(" ", 1)[1]) for line in said]
    assert len(losses[8]) == 2 and losses[8][0] > 0
    # The first step's loss is the same sum over the same targets; the second follows the same update.
    assert losses[3] == pytest.approx(losses[8], rel=1e-3) and losses[1] == pytest.approx(losses[8], rel=1e-3)
    with pytest.raises(ValueError, match="micro_batch"):
        cold_start(tmp_path / "0", steps=1, episodes=4, micro_batch=0, base=str(tiny_model_path))


async def test_a_trainers_per_step_backends_generate_on_one_thread(tiny_model_path):
    """A rollout makes a backend per step; each generating on a thread of its own would give every step's tensors
    a fresh allocator arena, so the trainer's backends share one thread."""
    import threading
    import types

    from prompt_r1.training.sync.policy import on_trainer_thread

    trainer = types.SimpleNamespace()
    threads, agents = [], []  # the agents kept alive, so that no thread's id is freed for another to reuse
    for _ in range(3):
        agent = on_trainer_thread(trainer, greedy(tiny_model_path))
        agents.append(agent)
        real = agent._generate_locked

        def seen(batch, real=real):
            threads.append(threading.get_ident())
            return real(batch)

        agent._generate_locked = seen
        await agent.generate(AgentRequest(messages=MESSAGES, max_new_tokens=2))
    assert len(threads) == 3 and len(set(threads)) == 1
    assert threading.main_thread().ident not in threads
