"""Evaluation: the paper's comparisons as runs, and their reports.

- `harness`: `run_evaluation`, the harness behind `prompt-r1 eval` (every method over every suite); `search_run`: a
  folder's prompt-optimiser searches, then its rows; `plan`: suites, methods and their settings;
- `reports`, `charts`: tables, CSV and figures; `sweep`: one agent against several environments;
- `optimizers/`: the prompt-optimiser baselines (OPRO, GEPA, TextGrad).

May import: runs, loop, agents, clients, data, scoring, core. Never training.
"""
