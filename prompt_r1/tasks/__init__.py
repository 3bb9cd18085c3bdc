"""Training tasks only the environment can answer: a scripted environment, its data, the agent a tiny model starts
from, and the rollout hooks and figures that say whether GRPO taught the agent to collaborate.

- `door_codes`: one call (ask the question's door, copy its code); `door_training`: its synchronous rollout,
  controls and figures; `door_async`: the same task under the asynchronous trainer (a table per group);
  `door_run`: the task in one command, built, trained and reported (`prompt-r1 train --task door-codes`,
  `training/door_demo.py`);
- `hops`: a chain of 1 to 3 dependent calls (a key opens a door, a door leads to a room, a room has a code);
  `hops_agent`: the tiny agent it starts from; `hops_training`: its rollout, chain figures and controls;
  `hops_async`: the same task under the asynchronous trainer;
- `notes`: a task for real models: the environment (the built-in instruct model, served over HTTP) holds a sheet
  of notes about made-up things and people, and a question needs 1 or 2 dependent calls; `notes_agent`: the cold
  start that teaches the built-in model the protocol, and the adapters; `notes_training`: its rollout and figures;
  `notes_async`: the same task under the asynchronous trainer (a sheet per group); `notes_eval`: the comparison
  with direct prompting, an instruction, OPRO and GEPA (`evals/bench/real_agent.py`; the trained agent ships as
  `smollm2-135m-notes`).

What every task shares: `skeleton` (the rollout that draws the task's facts each step, the trainer config) and
`skeleton_async` (the environment keyed by the episode's group, the async trainer, the vLLM-served async run).

Add a task: a module with its facts (redrawn per step, or per group under the async trainer, so that nothing can
be memorised), a `ScriptedServer` responder, rows, and an agent builder that teaches skills, not the choice; a
`*_training` module with its rollout and figures; then a `--task` entry in `evals/bench/learning.py`, and for
`prompt-r1 train --task` a `*_run` module like `door_run` and its name in `prompt_r1/cli/train_task.py`.

May import: every layer below it, and `prompt_r1.testing` (tiny models, scripted servers, vLLM launcher). Above it
only the surfaces (cli) and the benchmarks import it.
"""
