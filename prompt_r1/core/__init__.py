"""The ground: what every other layer stands on, and which stands on nothing of the project.

- `protocol`: the agent's tagged output (`<think>`, `<interaction_prompt>`, `<answer>`) parsed into turns;
- `prompts`: the paper's texts (question message, instruction template, environment system prompt);
- `text`, `tokens`: text repair and checks; chat-template token ids for token-exact turns;
- `errors`: the error hierarchy and its retry rule; `events`: the loop's streamed events; `aio`: event-loop helpers;
- `config`: the typed settings (`AgentConfig`, `EnvironmentConfig`, `LoopConfig`), read once at a surface's edge;
- `redaction`: the process-wide set of API keys that every writer cuts out;
- `hashing`: the stable hash under which a paid reply is kept (response cache, call ledgers);
- `checks`: the one check of every number a user gives; `signals`: SIGTERM taken as Ctrl-C, and which one arrived.

Add a loop setting: a `LoopConfig` field in `config` (every surface takes `loop=LoopConfig(...)`); a rate store
kind: `urls` (`MEMORY_STORE`, `STORE_SCHEMES`, `is_shared_store`).

May import: no other layer of prompt_r1, and no heavy library (torch, transformers, trl, vllm); the import contract
in pyproject.toml (`lint-imports`) holds it so.
"""
