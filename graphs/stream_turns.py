"""Stream an episode node by node with `astream`, e.g. to show the agent/environment collaboration in a UI.

python graphs/stream_turns.py --demo
"""

from __future__ import annotations

import asyncio

from _common import loop_from_args, parser


async def main(graph, question: str) -> None:
    async for update in graph.astream({"question": question}, stream_mode="updates"):
        for node, change in update.items():
            for turn in (change or {}).get("turns", []):
                if node == "agent":
                    print(f"[agent]       {turn.get('prompt') or turn.get('answer') or turn.get('defects')}")
                elif turn.get("response") is not None:
                    print(f"[{node}] {turn['response']}")
            if (change or {}).get("status"):  # set by the step that ends the episode
                print(f"[{node}]  status={change['status']} answer={change.get('answer')!r}")


if __name__ == "__main__":
    args = parser(__doc__, question=True).parse_args()
    with loop_from_args(args) as graph:
        asyncio.run(main(graph, args.question))
