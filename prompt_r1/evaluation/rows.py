"""One evaluation row: a method's answer to a sample, scored. The row maker `eval_work` is the same whether the row
is made in this process (prompt_r1.evaluation.harness) or in a Ray actor (`eval --ray`, prompt_r1.runs.ray_batch
builds it there on the actor's own agent and environment).

    work = eval_work(agent, environment, loop, prices, methods=["prompt-r1", "env-only"], agent_model="agent",
                     agent_paid=True, instructions={})
    row = await work(EvalItem("env-only", sample))
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prompt_r1.agents.base import AgentRequest
from prompt_r1.clients.costs import PriceTable
from prompt_r1.core.config import LoopConfig
from prompt_r1.core.errors import (
    AgentError,
    AgentRefused,
    ContextOverflow,
    EnvironmentCallError,
    EnvironmentRefused,
)
from prompt_r1.core.prompts import CHAIN_OF_THOUGHT_TEMPLATE, DIRECT_ANSWER_TEMPLATE
from prompt_r1.core.protocol import ANSWER_CLOSE, last_answer
from prompt_r1.data.datasets import Sample
from prompt_r1.evaluation.optimizers.search import OPTIMIZERS, instruction_request
from prompt_r1.evaluation.reports import row_metrics
from prompt_r1.loop.protocols import protocol_for
from prompt_r1.runs.episode import FAILED_STATUSES, EpisodeRunner, describe_exception
from prompt_r1.runs.metering import row_cost
from prompt_r1.scoring.rewards import PRESETS, score_episode

__all__ = ["EvalItem", "eval_work", "row_head"]


@dataclass(frozen=True)
class EvalItem:
    """One row to produce: a method on a sample."""

    method: str
    sample: Sample

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.method, str(self.sample.dataset), str(self.sample.id))

    @property
    def question(self) -> str:
        return self.sample.question

    @property
    def index(self) -> int:
        return self.sample.index

    def describe(self) -> str:
        return f"row {'/'.join(self.key)}"


def row_head(item: EvalItem) -> dict[str, Any]:
    """How every row of an item begins: its key (method, dataset, id first), then the sample."""
    sample = item.sample
    return {
        "method": item.method,
        "dataset": sample.dataset,
        "id": sample.id,
        "index": sample.index,
        "question": sample.question,
        "golden_answers": sample.golden_answers,
    }


def baseline_request(method: str, question: str, instruction: str | None = None) -> str:
    if instruction is not None:  # a prompt optimiser's method: its instruction, then env-only's request
        return instruction_request(instruction, question)
    template = CHAIN_OF_THOUGHT_TEMPLATE if method == "env-cot" else DIRECT_ANSWER_TEMPLATE
    return template.format(question=question)


async def baseline(
    method: str,
    sample: Sample,
    row: dict[str, Any],
    agent: Any,
    environment: Any,
    instruction: str | None = None,
) -> tuple[str, str, str | None, float]:
    """One baseline's answer: (prediction, status, error, latency); its usage and reply go into `row`."""
    started = time.monotonic()
    prediction, status, error = "", "answered", None
    request = baseline_request(method, sample.question, instruction)
    try:
        if method == "agent-only":
            output = await agent.generate(
                AgentRequest(messages=[{"role": "user", "content": request}], stop=(ANSWER_CLOSE,))
            )
            text = output.text
            row["usage"] = {
                "agent_calls": 1,
                "agent_prompt_tokens": output.prompt_tokens,
                "agent_completion_tokens": output.completion_tokens,
            }
        else:
            reply = await environment.respond(request)
            text = reply.text
            row["usage"] = {
                "env_calls": 1,
                "env_input_tokens": reply.input_tokens,
                "env_output_tokens": reply.output_tokens,
                "env_retries": reply.attempts - 1,
            }
            row["environment_calls"] = [reply.to_dict()]
        row["response"] = text
        tagged = last_answer(text)
        row["answer_tagged"] = tagged is not None
        prediction = tagged if tagged is not None else text.strip()
        status = "answered" if tagged is not None else "untagged"
    except EnvironmentRefused as exc:  # an outcome, as in the loop: not retried by the next run
        status, error = "refused", str(exc)
    except EnvironmentCallError as exc:
        status, error = "environment_error", str(exc)
    except ContextOverflow as exc:
        status, error = "context_overflow", str(exc)
    except AgentRefused as exc:
        status, error = "refused", str(exc)
    except AgentError as exc:
        status, error = "agent_error", str(exc)
    except Exception as exc:  # this row's failure, recorded and retried by the next run; the others go on
        status, error = "internal_error", describe_exception(exc)
    return prediction, status, error, time.monotonic() - started


def eval_work(agent: Any, environment: Any, loop: LoopConfig, prices: PriceTable, *, methods: Sequence[str],
              agent_model: str, agent_paid: bool, instructions: Mapping[tuple[str, str], str] | None = None):  # fmt: skip
    """Eval's row maker on these players: an `EvalItem`'s row (a prompt-r1 episode through the shared episode
    runner, or a baseline's one call), scored and priced. A served agent's tokens are paid for (`agent_paid`); a
    local model's cost nothing unless the price table says otherwise."""
    runner = EpisodeRunner(agent, environment, loop, tags=["eval"]) if "prompt-r1" in methods else None
    protocol = protocol_for(loop)
    instructions = dict(instructions or {})

    async def work(item: EvalItem) -> dict[str, Any]:
        method, sample = item.method, item.sample
        row = row_head(item)
        if method == "prompt-r1":
            episode = await runner.run(
                sample.question,
                id=str(sample.id),
                golden_answers=sample.golden_answers,
                metadata={"dataset": sample.dataset, "method": method},
            )
            prediction, status, error = episode.answer or "", episode.status, episode.error
            row.update(turns=episode.turns, usage=episode.usage)
            state = {**episode.to_row(), "golden_answers": sample.golden_answers}
            row["reward"] = {name: score_episode(state, preset=name).total for name in PRESETS}
            # The protocol's own reward where it has one (the release's: on its stream), under its preset's name.
            own = protocol.episode_reward(sample.question, episode.turns, sample.golden_answers)
            if own is not None:
                row["reward"][protocol.reward_preset] = own.total
            latency = episode.latency_s
        else:
            instruction = instructions.get((method, sample.dataset)) if method in OPTIMIZERS else None
            prediction, status, error, latency = await baseline(
                method, sample, row, agent, environment, instruction
            )
        row.update(prediction=prediction, status=status, error=error, latency_s=round(latency, 3))
        row["cost_usd"] = row_cost(row, prices, agent_model, agent_paid=agent_paid)
        if status not in FAILED_STATUSES:
            row["metrics"] = row_metrics(prediction, sample.golden_answers)
        return row

    return work
