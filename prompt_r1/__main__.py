"""`python -m prompt_r1 …`: the same as the `prompt-r1` command (what `accelerate launch -m prompt_r1` runs)."""

import sys

from prompt_r1.cli.main import main

sys.exit(main())
