"""Integrations: the loop behind other people's interfaces.

- `chat_model`: `PromptR1Chat`, a LangChain chat model; `server`: an OpenAI-compatible HTTP server.

May import: runs, loop, agents, clients, data, scoring, core. Never training, cli or testing.
"""
