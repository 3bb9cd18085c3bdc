"""`PromptR1Chat`, the loop as a LangChain chat model: in an LCEL chain, as the model of a prebuilt agent, and
streamed turn by turn with `astream_events`.

python graphs/chat_model_demo.py --demo
python graphs/chat_model_demo.py --agent-model ./my-agent --env-model gpt-4o-mini "Your question"
"""

from __future__ import annotations

import asyncio
import warnings

from _common import parser, parts_from_args
from langchain_core.messages import HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate

from prompt_r1 import LoopConfig, PromptR1Chat
from prompt_r1.core.events import EVENT_NAME, format_event


def in_a_chain(chat: PromptR1Chat, question: str) -> str:
    # Only the last user message is answered: the agent writes the environment's prompts itself.
    chain = ChatPromptTemplate.from_messages([("human", "{question}")]) | chat | StrOutputParser()
    return chain.invoke({"question": question})


def as_an_agents_model(chat: PromptR1Chat, question: str) -> str:
    """The model of a prebuilt agent without tools (PromptR1Chat makes no tool calls)."""
    try:
        from langchain.agents import create_agent  # langchain 1.x, where the prebuilt agent now lives
    except ImportError:
        from langgraph.prebuilt import create_react_agent as create_agent

        warnings.filterwarnings("ignore", message="create_react_agent has been moved")
    agent = create_agent(chat, tools=[])
    return agent.invoke({"messages": [HumanMessage(question)]})["messages"][-1].content


async def turn_by_turn(chat: PromptR1Chat, question: str) -> None:
    """Each turn as it happens (the custom events named prompt_r1), then the streamed answer's text."""
    async for event in chat.astream_events(question, version="v2"):
        if event["event"] == "on_custom_event" and event["name"] == EVENT_NAME:
            print(format_event(event["data"]), flush=True)
        elif event["event"] == "on_chat_model_stream":
            print(f"streamed answer: {event['data']['chunk'].content}")


if __name__ == "__main__":
    args = parser(__doc__, question=True).parse_args()
    with parts_from_args(args) as (agent, environment):
        chat = PromptR1Chat(agent=agent, environment=environment, loop=LoopConfig(max_turns=args.max_turns))
        print(f"chain: {in_a_chain(chat, args.question)}")
        print(f"agent: {as_an_agents_model(chat, args.question)}")
        asyncio.run(turn_by_turn(chat, args.question))
