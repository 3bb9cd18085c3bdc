"""Many questions at once through the compiled graph's `abatch`, with a cap on concurrent episodes.

Episodes run independently (no lockstep between turns); environment calls from all of them share the endpoint's
rate limit. (`prompt-r1 batch` will add resumable output files, cost accounting and progress on top of this.)

    python graphs/batch_questions.py --demo --concurrency 4
"""

from __future__ import annotations

import asyncio
import time

from _common import loop_from_args, parser

QUESTIONS = [
    "Which magazine was started first, Arthur's Magazine or First for Women?",
    "Who wrote the novel that the film Blade Runner is based on?",
    "What is the capital of the country where the Eiffel Tower stands?",
    "Which planet has the most moons?",
]


async def main(graph, questions: list[str], concurrency: int) -> None:
    started = time.monotonic()
    results = await graph.abatch(
        [{"question": q} for q in questions], config={"max_concurrency": concurrency}
    )
    for question, result in zip(questions, results, strict=True):
        print(f"{result['status']:<17} {result['answer']!s:<24} {question}")
    print(f"{len(results)} episodes in {time.monotonic() - started:.2f}s")


if __name__ == "__main__":
    p = parser(__doc__)
    p.add_argument("--concurrency", type=int, default=8)
    args = p.parse_args()
    with loop_from_args(args) as graph:
        asyncio.run(main(graph, QUESTIONS, args.concurrency))
