"""Clients: the large LLM (the environment) over HTTP, and what every call to it shares.

- `environment`: `EnvironmentClient` (LangChain's ChatOpenAI with our retries, limits and usage) and the pool;
- `http_client`: the OpenAI client with checked responses and error classification;
- `ratelimit`: the per-endpoint limiter shared by every episode in the process;
- `costs`: price tables (`prices.yaml`) and usage meters.

May import: data, scoring, core.
"""
