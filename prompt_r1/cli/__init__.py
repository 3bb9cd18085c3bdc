"""The `prompt-r1` command: one module per command family, all on the shared flags and exit codes.

- `main`: the parser, `run` and the dispatch (`prompt_r1.cli.main:main` is the console script);
- `serve`, `batch`, `eval` (eval and score), `train` (train and merge): one command family each;
- `flags`: the flags, settings and exit codes they all share.

May import: every layer. Nothing imports it but `python -m prompt_r1`.
"""
