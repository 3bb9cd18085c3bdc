"""Scoring: the double-constrained reward, answer metrics and the evaluation scorers, as pure functions.

- `rewards`: the format reward gating the answer reward (paper §3.2), its presets, TRL's reward signature;
- `metrics`: SQuAD-normalised exact match and F1, math and semantic equivalence, golden-answer values, and
  `METRICS`, the registry of metric names;
- `scorers`: the named scorers of `prompt-r1 eval`/`score`.

Add a metric: a batch function and a `Metric` in `metrics.METRICS` (reports, charts, both scorers, per-row
figures and `score --metric` read it); a rule in `scorers._RELEASE_RULES` only if the release scores it otherwise.
docs/development.md works one through.

May import: core. No heavy library at import (the semantic scorer loads sentence-transformers on first use).
"""
