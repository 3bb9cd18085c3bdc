"""The `prompt-r1` command: one module per command family, all on the shared flags and exit codes.

- `main`: the parser, `run` and the dispatch (`prompt_r1.cli.main:main` is the console script);
- `serve`, `batch`, `eval` (eval and score; `eval_search`: its prompt-optimiser flags, `eval_manifest`: its
  manifest), `train` (train and merge): one command family each;
- `flags`: the flags, settings and exit codes they all share.

Add a flag: an agent, environment or loop setting is a field of its config in `prompt_r1.core.config` and
becomes a flag of every command that runs episodes by itself; a command's own flag goes in its module's parser
(numbers through `prompt_r1.core.checks.flag_number`) and on its docs page. A renamed flag keeps its old name for
one release through `flags.add_deprecated_alias`.

May import: every layer. Nothing imports it but `python -m prompt_r1`.
"""
