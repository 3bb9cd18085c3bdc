"""Watch GRPO teach a tiny agent to ask its environment, offline on a laptop's CPU, in about five minutes:

    python training/door_demo.py                      # the same as: prompt-r1 train --task door-codes
    python training/door_demo.py --max_steps 60 --seed 3 --output_dir runs/door-3

The door-codes task (prompt_r1/tasks/door_codes.py): a question asks for one door's code, which only the
environment knows and redraws every step, so the reward rises only as the agent learns to ask about the right door
and copy the code it is told. The run builds the tiny agent (a line per stage), starts the scripted environment on
127.0.0.1, trains with the learning benchmark's settings (a line per step), and ends with what was learned, where
curves.png is, and `reward: first 10 steps X -> last 10 steps Y`. Needs the dev and train extras.
"""

from __future__ import annotations

import sys

from prompt_r1.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["train", "--task", "door-codes", *sys.argv[1:]]))
