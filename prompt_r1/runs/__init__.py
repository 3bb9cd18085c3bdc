"""Runs: episodes run the same way for every surface, and what they leave behind.

- `episode`: `Episode` (the one record every surface returns) and `EpisodeRunner` (config, tracing, concurrency);
- `pool`: many episodes under limits, with interruption; `batch`: `prompt-r1 batch`'s run over a dataset;
- `result_store`: `ResultStore`, the resumable store of result rows (what to run, rerun or keep);
  `output_files`: the files a run writes (the results file's format, reading and compaction, and every output
  path checked before a byte is written); `metering`: budgets and costs; `manifest`: what made an output
  (code, versions, settings, seeds, prices, machine), checked when a run adds to it;
- `shards`: one input split across machines by a stable hash of the row id (`batch --shard I/N`), and the merge.

May import: loop, agents, clients, data, scoring, core.
"""
