"""Clients: the large LLM (the environment) over HTTP, and what every call to it shares.

- `environment`: `EnvironmentClient` (LangChain's ChatOpenAI with our retries, limits and usage);
  `environment_pool`: `EnvironmentPool`, several endpoints behind one client (routing, fallback);
- `http_client`: the OpenAI client with checked responses and error classification;
- `ratelimit`: the per-endpoint limiter shared by every episode in the process;
- `limit_store`, `shared_limit`: one endpoint's limits shared by every process and machine through Redis;
- `costs`: price tables (`prices.yaml`) and usage meters;
- `response_cache`: answers paid for once and replayed (`--env-cache`), in a file or the store's Redis;
  `cache_store`: the cache's base class and its SQLite file; `sqlite_files`: how the cache and training's call
  ledger make and check their SQLite files.

Add a provider: nothing here for an OpenAI-compatible endpoint (`--env-base-url`, `--env-model`,
`--env-api-key-env`); any other LangChain chat model goes in as `EnvironmentClient(config, chat_model=...)`.
Add a price: a line in `prices.yaml` (dollars per 1M tokens), or the user's own `--prices FILE`. A rate store kind
is named in `prompt_r1.core.urls` and built in `limit_store`.

May import: data, scoring, core.
"""
