"""`prompt-r1 serve`'s OpenAI-compatible server, called with the `openai` client: one completion, then one streamed
with each per-turn event as it happens.

python graphs/serve_demo.py --demo                                   # starts the server on 127.0.0.1 itself
python graphs/serve_demo.py --agent-model ./my-agent --env-model gpt-4o-mini "Your question"
python graphs/serve_demo.py --url http://127.0.0.1:8000/v1 "Your question"   # a running `prompt-r1 serve`
"""

from __future__ import annotations

import openai
from _common import parser, parts_from_args

from prompt_r1 import LoopConfig
from prompt_r1.core.events import format_event
from prompt_r1.integrations.server import build_app, serving_in_thread


def ask(url: str, question: str, model: str = "prompt-r1") -> None:
    client = openai.OpenAI(base_url=url, api_key="unused")  # --api-key-env on the server: its key here
    messages = [{"role": "user", "content": question}]
    completion = client.chat.completions.create(model=model, messages=messages)
    extra = completion.model_extra["prompt_r1"]  # status, turns, usage, error
    print(f"answer: {completion.choices[0].message.content}  ({extra['status']}, {len(extra['turns'])} turns, "
          f"{completion.usage.total_tokens} tokens)")  # fmt: skip
    print("streamed:")
    for chunk in client.chat.completions.create(model=model, messages=messages, stream=True):
        event = (chunk.model_extra or {}).get("prompt_r1_event")
        if event is not None:
            print(format_event(event), flush=True)
        elif chunk.choices and chunk.choices[0].delta.content:
            print(f"streamed answer: {chunk.choices[0].delta.content}")


if __name__ == "__main__":
    p = parser(__doc__, question=True)
    p.add_argument("--url", help="call the server at this base URL instead of starting one")
    args = p.parse_args()
    if args.url:
        ask(args.url, args.question)
    else:
        with parts_from_args(args) as (agent, environment):
            app = build_app(
                agent, environment, loop=LoopConfig(max_turns=args.max_turns), model_name="prompt-r1"
            )
            with serving_in_thread(app) as url:
                ask(url, args.question)
