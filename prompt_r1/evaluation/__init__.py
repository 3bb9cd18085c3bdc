"""Evaluation: the paper's comparisons as runs, and their reports.

- `run`: `run_evaluation`, every method over every suite; `plan`: suites, methods and their settings;
- `reports`, `charts`: tables, CSV and figures; `sweep`: one agent against several environments;
- `optimizers/`: the prompt-optimiser baselines (OPRO, GEPA, TextGrad).

May import: runs, loop, agents, clients, data, scoring, core. Never training.
"""
