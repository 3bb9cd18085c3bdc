"""Test doubles, shipped as LangChain ships its fakes: the outside world played offline.

- `scripted`: responders and in-process agent and environment doubles; `servers`: a scripted OpenAI-compatible
  HTTP server with fault injection; `provider`: a provider's RPM/TPM per key with its 429s and x-ratelimit-*
  headers, for that server; `redis_server`: a real redis-server on a free port; `limit_worker`: a process
  calling one endpoint many times (the shared-limit tests);
- `tiny_models`: tiny transformers models and tokenizers built in process; `vllm_process`: `vllm serve` of one
  for the async trainer's CPU route; `door_codes`: a task a tiny model learns,
  `door_training`: its GRPO trainer, rollout, controls and figures (the learning benchmark's); `door_async`: the
  task under the asynchronous trainer (a table per group of episodes).

May import: every layer below the surfaces (training included); never cli or integrations. Nothing of the
library imports it.
"""
