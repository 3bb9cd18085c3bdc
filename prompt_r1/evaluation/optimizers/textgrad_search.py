"""TextGrad (the `textgrad` package) as a prompt-optimiser baseline: the instruction is a TextGrad variable, the
environment answers under it through the run's client, and TextGrad's backward and optimiser calls go to the
optimiser ("reflection") model through a client of the same endpoint.

TextGrad is synchronous; as with GEPA, the search runs in a worker thread and every model call is sent back to
the event loop, so it shares the run's rate limiter, retries, key redaction and token counts. Each step answers a
minibatch of training rows under the current instruction, scores each answer with token F1 as TextGrad's loss (a
sentence saying the score and the right answer), back-propagates it to the instruction and lets the optimiser
rewrite it; the new instruction is then scored on every training row, and the best is kept. TextGrad's own
system prompts reach the optimiser model at the head of the user message (our client sends its own system prompt).

Importing textgrad imports litellm, which fetches a price list from the internet unless told to use its bundled
copy: LITELLM_LOCAL_MODEL_COST_MAP is set first, so nothing leaves the machine. It also opens a log file of every
call on import, in ./logs unless TEXTGRAD_LOG_DIR says otherwise: the search points it into the output folder.
"""

from __future__ import annotations

import os
import random
from collections.abc import Awaitable, Callable, Sequence

from prompt_r1.core.aio import in_worker_thread
from prompt_r1.core.errors import BackendUnavailable

__all__ = ["MINIBATCH", "textgrad_search"]

MINIBATCH = 3  # training rows per TextGrad step (its prompt-optimisation tutorial's size)
SEED_INSTRUCTION = "Answer the question."


async def textgrad_search(
    reply: Callable[[str, str], Awaitable[str]],
    score: Callable[[str, Sequence[str]], float],
    propose: Callable[[str], Awaitable[str]],
    rows: Sequence[tuple[str, Sequence[str]]],
    *,
    budget: int,
    seed: int = 0,
    log_dir: str | os.PathLike | None = None,
) -> tuple[str, float, int, list[tuple[str, float]]]:
    """(best instruction, its mean score on `rows`, metric calls spent, every instruction tried with its score).
    `reply(instruction, question)` is the environment's answer; `score(text, golden answers)` a row's score.
    `log_dir`: where TextGrad writes the log it opens on import (else ./logs in the working folder)."""
    import sys

    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    if log_dir is not None and "textgrad" not in sys.modules:
        os.environ["TEXTGRAD_LOG_DIR"] = str(log_dir)
    try:
        import textgrad as tg
        from textgrad.autograd import StringBasedFunction
        from textgrad.engine.base import EngineLM
    except ImportError as exc:
        raise BackendUnavailable(
            "the textgrad method needs the textgrad package: pip install textgrad"
        ) from exc

    def run(call) -> tuple[list[tuple[str, float]], int]:
        """The search, in the worker thread; `call` runs a coroutine on the event loop (aio.in_worker_thread)."""

        class TaskEngine(EngineLM):
            """The environment, answering a question under the instruction TextGrad passes as the system prompt."""

            model_string = "prompt-r1-environment"

            def generate(self, prompt, system_prompt=None, **kwargs):
                return call(reply(system_prompt or "", prompt))

            def __call__(self, prompt, **kwargs):
                return self.generate(prompt, **kwargs)

        class ReflectionEngine(EngineLM):
            """The optimiser model: TextGrad's system prompt, then its request, as one user message."""

            model_string = "prompt-r1-reflection"

            def generate(self, prompt, system_prompt=None, **kwargs):
                return call(propose(f"{system_prompt}\n\n{prompt}" if system_prompt else prompt))

            def __call__(self, prompt, **kwargs):
                return self.generate(prompt, **kwargs)

        rng = random.Random(seed)
        reflection = ReflectionEngine()
        tg.set_backward_engine(reflection, override=True)
        instruction = tg.Variable(
            SEED_INSTRUCTION,
            requires_grad=True,
            role_description="instruction placed before every question to the language model",
        )
        model = tg.BlackboxLLM(TaskEngine(), instruction)
        optimizer = tg.TextualGradientDescent(engine=reflection, parameters=[instruction])
        golds_of = dict(rows)

        def feedback(prediction, question):
            value = score(prediction.value, golds_of[question.value])
            right = " | ".join(golds_of[question.value])
            return f"Token F1 {value:.2f}." + ("" if value == 1.0 else f" The correct answer is: {right}")

        loss_fn = StringBasedFunction(feedback, "scores the answer against the correct answer")

        def mean_score(text: str) -> float:
            return sum(score(reply_sync(text, q), g) for q, g in rows) / len(rows)

        def reply_sync(text: str, question: str) -> str:
            return call(reply(text, question))

        tried = [(SEED_INSTRUCTION, mean_score(SEED_INSTRUCTION))]
        calls = len(rows)
        batch = min(MINIBATCH, len(rows))
        while calls + batch + len(rows) <= budget:
            optimizer.zero_grad()
            losses = []
            for question, _ in rng.sample(list(rows), batch):
                asked = tg.Variable(
                    question, requires_grad=False, role_description="question to the language model"
                )
                losses.append(loss_fn(inputs={"prediction": model(asked), "question": asked}))
            tg.sum(losses).backward()
            calls += batch
            try:
                optimizer.step()
            except Exception:  # an optimiser reply without TextGrad's tags (IndexError, ...)
                continue  # the instruction stays as it was; the step's calls are spent all the same
            candidate = instruction.value
            tried.append((candidate, mean_score(candidate)))
            calls += len(rows)
        return tried, calls

    tried, calls = await in_worker_thread(run)
    best = max(reversed(tried), key=lambda item: item[1])  # among equals the earliest
    return best[0], best[1], calls, tried
