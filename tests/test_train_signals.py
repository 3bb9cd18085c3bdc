"""Ctrl-C or SIGTERM during `prompt-r1 train`: the step in flight finishes, a checkpoint of it is saved, the
command says where and exits 143 (130 for Ctrl-C), and `--resume` goes on from it; a second signal stops at once.
Real `prompt-r1 train` processes, real signals, a tiny local agent and a scripted environment on 127.0.0.1 that
answers slowly, so that the signal lands in the middle of a step."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("trl")

from conftest import NAME_RESPONSE  # noqa: E402
from helpers import ROOT, cli_command, run_cli, spawn, tiny_train_args, wait_for, write_name_dataset  # noqa: E402

from prompt_r1.testing.servers import ScriptedServer  # noqa: E402


def _train_args(model: Path, tmp_path: Path, server: ScriptedServer, *extra: str) -> list[str]:
    rows = write_name_dataset(tmp_path / "names.jsonl", 32)
    return cli_command(
        tiny_train_args(model, server.base_url, rows, tmp_path / "run", "--max_steps", "6", "--save_strategy", "no",
                        *extra)
    )  # fmt: skip


def _spawn(command: list[str], log: Path) -> subprocess.Popen:
    return spawn(
        command, log, cwd=log.parent, env={"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    )


def _finish(proc: subprocess.Popen, timeout: float = 300.0) -> int:
    try:
        return proc.wait(timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.timeout(900)
def test_sigterm_finishes_the_step_saves_a_checkpoint_and_resume_goes_on(
    protocol_model_path, tmp_path, monkeypatch
):
    log = tmp_path / "train.log"
    # 0.2 s per environment call: a step takes a second or more, so the signal lands inside one.
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}, latency=0.2) as server:
        command = _train_args(protocol_model_path, tmp_path, server)
        proc = _spawn(command, log)
        wait_for(
            lambda: server.counts.get("env", 0) >= 1 or proc.poll() is not None, "the first rollout", 180
        )
        proc.send_signal(signal.SIGTERM)
        code = _finish(proc)
        output = log.read_text()
        assert code == 143, output[-3000:]
        stopped = re.search(r"stopped by SIGTERM after step (\d+); saved (\S+); resume with --resume", output)
        assert stopped, output[-3000:]
        step = int(stopped[1])
        assert 1 <= step < 6 and Path(stopped[2]) == tmp_path / "run" / f"checkpoint-{step}"
        assert (tmp_path / "run" / f"checkpoint-{step}" / "trainer_state.json").is_file()
        assert "finishing this step and saving a checkpoint" in output and "Traceback" not in output
        assert not (tmp_path / "run" / "model.safetensors").exists()  # the checkpoint is the result

        # The resumed run in this process (the signals were the launched one's): a process start fewer.
        monkeypatch.chdir(tmp_path)  # where the launched run ran
        code, _, err = run_cli([*command[3:], "--resume"])
    assert code == 0, err[-3000:]
    assert "trained 6 steps" in err
    assert (tmp_path / "run" / "model.safetensors").exists()


@pytest.mark.timeout(600)
def test_a_second_signal_stops_at_once(protocol_model_path, tmp_path):
    log = tmp_path / "train.log"
    # 20 s per environment call: the first step cannot finish while the test waits.
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}, latency=20.0) as server:
        proc = _spawn(_train_args(protocol_model_path, tmp_path, server, "--env_timeout", "60"), log)
        wait_for(
            lambda: server.counts.get("env", 0) >= 1 or proc.poll() is not None, "the first rollout", 180
        )
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: "send it again to stop at once" in log.read_text(), "the first signal's line", 30)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        code = _finish(proc, timeout=60)
        waited = time.monotonic() - started
    output = log.read_text()
    assert code == 130, output[-3000:]
    assert "interrupted (SIGINT)" in output and waited < 15, output[-3000:]
    assert not list((tmp_path / "run").glob("checkpoint-*"))


@pytest.mark.slow  # a 2-process DeepSpeed launch: ~2 min on 2 cores; the one-process tests above run by default
@pytest.mark.timeout(900)
def test_both_ranks_under_accelerate_launch_save_the_same_step_and_stop(protocol_model_path, tmp_path):
    """SIGTERM to the launcher reaches every rank; they agree on the step, save it once, and stop together."""
    import socket

    log = tmp_path / "launch.log"
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}, latency=0.2) as server:
        command = _train_args(protocol_model_path, tmp_path, server)
        accelerate = [str(Path(sys.executable).parent / "accelerate"), "launch", "--main_process_port", str(port),
                      "--config_file", str(ROOT / "training/accelerate/deepspeed_zero2.yaml"),
                      "--num_processes", "2", "-m", *command[2:]]  # fmt: skip
        proc = _spawn(accelerate, log)
        wait_for(
            lambda: server.counts.get("env", 0) >= 2 or proc.poll() is not None, "the first rollouts", 300
        )
        proc.send_signal(signal.SIGTERM)
        _finish(proc)
    output = log.read_text()
    stopped = re.findall(r"stopped by SIGTERM after step (\d+); saved (\S+);", output)
    assert len(stopped) == 1, output[-4000:]  # said once, by the main process
    step = int(stopped[0][0])
    state = json.loads((tmp_path / "run" / f"checkpoint-{step}" / "trainer_state.json").read_text())
    assert state["global_step"] == step
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == [f"checkpoint-{step}"]
