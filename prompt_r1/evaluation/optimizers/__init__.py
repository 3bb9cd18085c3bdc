"""Prompt-optimiser baselines: an instruction searched on training questions, then evaluated like any method.

- `search`: the shared settings, dispatch and spend; `opro`, `gepa_search`, `textgrad_search`: one method each.

May import: what evaluation may import (runs and below).
"""
