"""Data: questions and golden answers in, from the bundled evaluation sets or the user's files.

- `datasets`: the paper's 12 bundled sets and user parquet/JSONL/JSON files as `Sample`s;
- `training_mix`: builds the GRPO training mix from the release's sources.

May import: scoring, core.
"""
