"""The tiny-cpu recipe end to end on a laptop: a tiny agent model, a scripted environment, real TRL GRPO.

    python training/tiny_demo.py                       # one process
    python training/tiny_demo.py --processes 2         # accelerate launch, DeepSpeed ZeRO-2, 2 CPU processes
    python training/tiny_demo.py --processes 2 --zero 3

Builds (once) a tiny model taught the Prompt-R1 turn format in a few seconds (`training/tiny-model`), starts an
OpenAI-compatible environment on 127.0.0.1 (prompt_r1.testing.servers.ScriptedServer, echoing each prompt), and runs
`prompt-r1 train --config training/configs/tiny-cpu.yaml` against it on the shipped training sample. Extra
arguments go to `prompt-r1 train` (e.g. `--max_steps 8`). Needs the dev and train extras.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build_model(model: Path) -> Path:
    from prompt_r1.testing.tiny_models import build_protocol_model

    if not (model / "config.json").is_file():
        print(f"building the tiny agent model in {model} (about a minute on 2 cores) ...", file=sys.stderr)
        turn1 = "<think>ask</think><interaction_prompt>Which name?</interaction_prompt>"
        episodes = [
            (
                "Which name does the item have?",
                turn1,
                "The name is Ada.",
                f"<think>ok</think><answer>{n}</answer>",
            )
            for n in ("Ada", "Bob", "Cy", "Dee")
        ]
        build_protocol_model(model, episodes, steps=150)
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=1, help="CPU processes (2+: accelerate launch)")
    parser.add_argument(
        "--zero", type=int, choices=[2, 3], default=2, help="DeepSpeed ZeRO stage with 2+ processes"
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=ROOT / "training" / "tiny-model",
        help="where the tiny model is (built if absent)",
    )
    args, rest = parser.parse_known_args()

    from prompt_r1.testing.servers import ScriptedServer, echo_environment

    model = build_model(args.model_dir)
    with ScriptedServer({"env": echo_environment()}) as server:
        train = [
            "train",
            "--config",
            str(ROOT / "training/configs/tiny-cpu.yaml"),
            "--model_name_or_path",
            str(model),
            "--env-base-url",
            server.base_url,
            *rest,
        ]
        if args.processes > 1:
            accelerate = Path(sys.executable).parent / "accelerate"
            config = ROOT / f"training/accelerate/deepspeed_zero{args.zero}.yaml"
            command = [
                str(accelerate),
                "launch",
                "--config_file",
                str(config),
                "--num_processes",
                str(args.processes),
            ]
            command += ["-m", "prompt_r1", *train]
        else:
            command = [sys.executable, "-m", "prompt_r1", *train]
        print("$", " ".join(command), file=sys.stderr)
        return subprocess.call(command, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
