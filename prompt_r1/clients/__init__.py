"""Clients: the large LLM (the environment) over HTTP, and what every call to it shares.

- `environment`: `EnvironmentClient` (LangChain's ChatOpenAI with our retries, limits and usage) and the pool;
- `http_client`: the OpenAI client with checked responses and error classification;
- `ratelimit`: the per-endpoint limiter shared by every episode in the process;
- `limit_store`, `shared_limit`: one endpoint's limits shared by every process and machine through Redis;
- `costs`: price tables (`prices.yaml`) and usage meters.

May import: data, scoring, core.
"""
