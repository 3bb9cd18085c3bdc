"""Integrations: the loop behind other people's interfaces.

- `chat_model`: `PromptR1Chat`, a LangChain chat model (`chat_options`: its call's keywords, honoured, refused or
  named as ignored); `server`: an OpenAI-compatible HTTP server (`server_requests`: a request body read and checked).

May import: runs, loop, agents, clients, data, scoring, core. Never training, cli or testing.
"""
