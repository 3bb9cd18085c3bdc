"""Scoring: the double-constrained reward, answer metrics and the evaluation scorers, as pure functions.

- `rewards`: the format reward gating the answer reward (paper §3.2), its presets, TRL's reward signature;
- `metrics`: SQuAD-normalised exact match and F1, math and semantic equivalence, golden-answer values;
- `scorers`: the named scorers of `prompt-r1 eval`/`score`.

May import: core. No heavy library at import (the semantic scorer loads sentence-transformers on first use).
"""
