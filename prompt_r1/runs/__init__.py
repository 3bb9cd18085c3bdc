"""Runs: episodes run the same way for every surface, and what they leave behind.

- `episode`: `Episode` (the one record every surface returns) and `EpisodeRunner` (config, tracing, concurrency);
- `pool`: many episodes under limits, with interruption; `batch`: `prompt-r1 batch`'s run over a dataset;
- `results`, `results_file`: the resumable results store and its file format; `metering`: budgets and costs;
- `shards`: one input split across machines by a stable hash of the row id (`batch --shard I/N`), and the merge.

May import: loop, agents, clients, data, scoring, core.
"""
