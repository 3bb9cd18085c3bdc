"""The loop: one episode as a LangGraph state machine, agent ⇄ environment ▸ finalize.

- `graph`: `build_graph` and the episode state; `graph_runnables`: how its nodes are wrapped as runnables;
- `release`: the reference release's protocol (`--protocol release`) and its chat template
  (`release_chat_template.jinja`).

May import: agents, clients, data, scoring, core.
"""
