"""The former name of `training/door_demo.py` (the tiny-cpu recipe it ran did not learn in a demo's time): it
says so and runs that demo with the same flags (`--max_steps N`, `--output_dir DIR`, `--seed S`)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

if __name__ == "__main__":
    print("tiny_demo.py is now door_demo.py: running python training/door_demo.py", file=sys.stderr)
    runpy.run_path(str(Path(__file__).with_name("door_demo.py")), run_name="__main__")
