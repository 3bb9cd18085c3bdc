"""Stream an episode's per-turn events (think, prompt, response, answer, end) as they happen, e.g. for a UI.

python graphs/stream_turns.py --demo
"""

from __future__ import annotations

import asyncio

from _common import loop_from_args, parser

from prompt_r1.core.events import format_event


async def main(graph, question: str) -> None:
    async for event in graph.astream({"question": question}, stream_mode="custom"):
        print(format_event(event), flush=True)


if __name__ == "__main__":
    args = parser(__doc__, question=True).parse_args()
    with loop_from_args(args) as graph:
        asyncio.run(main(graph, args.question))
