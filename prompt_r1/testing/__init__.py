"""Test doubles, shipped as LangChain ships its fakes: the outside world played offline.

- `scripted`: responders and in-process agent and environment doubles; `servers`: a scripted OpenAI-compatible
  HTTP server with fault injection (`server_command`: `python -m prompt_r1.testing.servers --port N`, that server
  on its own for any client); `rate_limit_simulator`: a provider's RPM/TPM per key simulated, with its
  429s and x-ratelimit-* headers, for that server; `redis_server`: a real redis-server on a free port; `limit_worker`: a process
  calling one endpoint many times (the shared-limit tests);
- `tiny_models`: tiny transformers models and tokenizers built in process; `vllm_process`: `vllm serve` of one
  for the async trainer's CPU route.

May import: every layer below the surfaces (training included); never cli, integrations or tasks. Of the library,
only `prompt_r1.tasks` imports it (a task builds its tiny agent and serves it).
"""
