"""Prompt-R1 as one node of a larger LangGraph app: rewrite the user's request, answer it, then format a reply.

python graphs/embed_in_parent.py --demo
python graphs/embed_in_parent.py --agent-model ./my-agent --env-model gpt-4o-mini "Your question"
"""

from __future__ import annotations

import operator
from typing import Annotated, TypedDict

from _common import loop_from_args, parser
from langgraph.graph import END, START, StateGraph


class AppState(TypedDict, total=False):
    request: str
    question: str  # the keys Prompt-R1 reads and writes are shared with the parent state
    answer: str | None
    status: str
    reply: str
    log: Annotated[list[str], operator.add]


def clean_request(state: AppState) -> dict:
    return {"question": " ".join(state["request"].split()), "log": ["cleaned"]}


def format_reply(state: AppState) -> dict:
    if state.get("status") == "answered":
        return {"reply": f"Answer: {state['answer']}", "log": ["formatted"]}
    return {"reply": f"No answer ({state.get('status')}).", "log": ["formatted"]}


def build_app(prompt_r1_graph):
    builder = StateGraph(AppState)
    builder.add_node("clean_request", clean_request)
    builder.add_node("prompt_r1", prompt_r1_graph)  # the compiled loop is an ordinary node
    builder.add_node("format_reply", format_reply)
    builder.add_edge(START, "clean_request")
    builder.add_edge("clean_request", "prompt_r1")
    builder.add_edge("prompt_r1", "format_reply")
    builder.add_edge("format_reply", END)
    return builder.compile()


if __name__ == "__main__":
    args = parser(__doc__, question=True).parse_args()
    with loop_from_args(args) as loop:
        result = build_app(loop).invoke(
            {"request": f"  {args.question}  "}
        )  # clean_request tidies the spaces
    print(result["reply"])
    print("steps:", ", ".join(result["log"]))
