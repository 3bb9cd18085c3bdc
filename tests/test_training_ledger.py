"""The call ledger and the spend cap: a resumed run never pays twice for a call, and a capped run stops cleanly.

Real parts throughout: a scripted OpenAI-compatible server on 127.0.0.1 that counts the requests it answered, the
environment client, SQLite files, TRL and DeepSpeed ZeRO-2 over 2 CPU processes (gloo) under `accelerate launch`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("trl")

from conftest import NAME_QUESTION, NAME_RESPONSE  # noqa: E402

from prompt_r1.cli.main import main as cli_main  # noqa: E402
from prompt_r1.clients.costs import PriceTable  # noqa: E402
from prompt_r1.clients.environment import EnvironmentClient  # noqa: E402
from prompt_r1.core.aio import run_sync  # noqa: E402
from prompt_r1.core.config import EnvironmentConfig  # noqa: E402
from prompt_r1.testing.servers import Fault, ScriptedServer  # noqa: E402
from prompt_r1.training.shared.ledger import (  # noqa: E402
    CallLedger,
    LedgerEnvironment,
    LedgerError,
    call_scope,
    ledger_path,
)

ROOT = Path(__file__).resolve().parents[1]
IDENTITY = {"seed": 0, "processes": 1, "rank": 0, "environment_model": "env"}


def _client(server: ScriptedServer) -> EnvironmentClient:
    return EnvironmentClient(
        EnvironmentConfig(model="env", base_url=server.base_url, api_key_env="PROMPT_R1_TEST_NO_KEY")
    )


def _prices(tmp_path: Path) -> PriceTable:
    path = tmp_path / "prices.yaml"
    path.write_text("env: {input: 2.0, output: 8.0}\n")
    return PriceTable.load(path)


def _respond(environment, prompt: str, *, episode: int, step: int = 0, scoped: bool = True):
    async def go():
        if not scoped:
            return await environment.respond(prompt, [])
        with call_scope(step=step, training=True, call=0, episode=episode):
            return await environment.respond(prompt, [])

    return run_sync(go())


def test_a_recorded_call_is_answered_from_the_ledger_and_not_sent_again(tmp_path):
    path = ledger_path(tmp_path / "run", 0)
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        first = LedgerEnvironment(_client(server), CallLedger.open(path, IDENTITY), _prices(tmp_path))
        reply = _respond(first, "Which name?", episode=0)
        # On disk as soon as the reply is back: another connection (another process after a crash) sees it.
        rows = sqlite3.connect(path).execute("SELECT step, episode, turn, cost FROM calls").fetchall()
        assert rows == [
            (0, 0, 0, pytest.approx((reply.input_tokens * 2.0 + reply.output_tokens * 8.0) / 1e6))
        ]
        # A restarted process: a new client and ledger object on the same file.
        again = LedgerEnvironment(_client(server), CallLedger.open(path, IDENTITY), _prices(tmp_path))
        replayed = _respond(again, "Which name?", episode=0)
        assert len(server.requests_for("env")) == 1  # answered from the ledger
        assert replayed == reply
        _respond(again, "Which name?", episode=1)  # another episode's call: its own key, sent
        _respond(again, "Which name?", episode=0, step=1)  # the same episode in another step: sent
        _respond(again, "Which name, then?", episode=0)  # another request in the same place: sent
        _respond(again, "Which name?", episode=0, scoped=False)  # outside a rollout: sent, not recorded
        assert len(server.requests_for("env")) == 5
    spend = again.take()
    assert (spend.calls, spend.replayed) == (5, 1)
    assert spend.cost > 0 and spend.unpriced == 0
    assert again.ledger.totals()["calls"] == 4
    assert again.take().calls == 0  # taking resets


def test_replies_landing_together_share_commits_off_the_event_loop_and_are_on_disk_when_seen(tmp_path):
    """Group commit: a commit waits for the disk, so it runs in a worker thread (the event loop goes on with the
    other episodes) and the calls that land while one is under way share the next. Each episode still sees its
    reply only once its row is committed."""
    import asyncio
    import threading

    path = ledger_path(tmp_path / "run", 0)
    ledger = CallLedger.open(path, IDENTITY)
    commits: list[tuple[int, bool]] = []  # (rows, on the event loop's thread)
    record_many = ledger.record_many
    loop_thread: list[int] = []

    def slow_disk(calls):
        commits.append((len(calls), threading.get_ident() in loop_thread))
        time.sleep(0.05)  # a disk's fsync
        record_many(calls)

    ledger.record_many = slow_disk
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        environment = LedgerEnvironment(_client(server), ledger, _prices(tmp_path))

        async def episode(i: int) -> int:
            with call_scope(step=0, training=True, call=0, episode=i):
                await environment.respond("Which name?", [])
            # Seen only once on disk: another connection (another process after a crash) reads the row.
            return (
                sqlite3.connect(path)
                .execute("SELECT COUNT(*) FROM calls WHERE episode = ?", (i,))
                .fetchone()[0]
            )

        async def run() -> list[int]:
            loop_thread.append(threading.get_ident())
            return await asyncio.gather(*(episode(i) for i in range(16)))

        assert run_sync(run()) == [1] * 16
        # The same ledger answers a call it recorded in this process (its places are kept up to date).
        _respond(environment, "Which name?", episode=3)
        assert len(server.requests_for("env")) == 16
    assert sum(rows for rows, _ in commits) == 16 and len(commits) < 16, commits
    assert not any(on_loop for _, on_loop in commits)
    assert ledger.totals()["calls"] == 16


def test_a_damaged_or_foreign_ledger_is_refused_in_one_line(tmp_path):
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"not a database at all\n" * 200)
    other = tmp_path / "other.sqlite"
    sqlite3.connect(other).execute("CREATE TABLE results (x)")
    ours = tmp_path / "ours.sqlite"
    CallLedger.open(ours, IDENTITY).close()
    damaged = tmp_path / "damaged.sqlite"
    ledger = CallLedger.open(damaged, IDENTITY)
    from prompt_r1.clients.environment import EnvironmentReply
    from prompt_r1.training.shared.ledger import CallKey

    for i in range(300):  # several pages, then a page in the middle overwritten
        ledger.record(
            CallKey(i, "train", 0, 0, 0, "h" * 32), EnvironmentReply("x" * 200, 1, 1, 1, 0.1, "env"), 0.1
        )
    ledger.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    ledger.close()
    data = bytearray(damaged.read_bytes())
    data[4096 * 3 : 4096 * 3 + 512] = b"\xff" * 512
    damaged.write_bytes(bytes(data))
    cases = [
        (garbage, IDENTITY, "not a readable call ledger"),
        (other, IDENTITY, "not a call ledger"),
        (ours, {**IDENTITY, "seed": 1}, "belongs to another run: seed '0' (this run: '1')"),
        (damaged, IDENTITY, "damaged"),
    ]
    for path, identity, said in cases:
        with pytest.raises(LedgerError) as caught:
            CallLedger.open(path, identity)
        message = str(caught.value)
        assert said in message and str(path) in message and "\n" not in message, message


def test_train_refuses_another_runs_ledger_before_loading_a_model(protocol_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    CallLedger.open(ledger_path(out, 0), {**IDENTITY, "seed": 7}).close()
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        code = cli_main([*_train_args(protocol_model_path, tmp_path, server, out), "--max_steps", "1"])
        assert server.requests_for("env") == []
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err[-1].startswith("prompt-r1: error: ") and "belongs to another run: seed '7'" in err[-1], err


def _name_dataset(folder: Path) -> Path:
    path = folder / "names.jsonl"
    rows = (
        json.dumps({"id": f"n{i}", "question": NAME_QUESTION, "golden_answers": ["Ada"]}) for i in range(64)
    )
    path.write_text("".join(row + "\n" for row in rows))
    return path


def _train_args(model: Path, tmp_path: Path, server: ScriptedServer, out: Path) -> list[str]:
    prices = tmp_path / "prices.yaml"
    prices.write_text("env: {input: 100.0, output: 400.0}\n")
    return [
        "train",
        "--config",
        str(ROOT / "training/configs/tiny-cpu.yaml"),
        "--model_name_or_path",
        str(model),
        "--train_data",
        str(_name_dataset(tmp_path)),
        "--env-base-url",
        server.base_url,
        "--max_turn_tokens",
        "24",
        "--max_total_tokens",
        "96",
        "--prices",
        str(prices),
        "--output_dir",
        str(out),
    ]


def _logged(out: Path, step: int) -> list[dict]:
    state = json.loads((out / f"checkpoint-{step}/trainer_state.json").read_text())
    return [row for row in state["log_history"] if "env/calls" in row]


def test_a_cap_stops_the_run_with_a_checkpoint_and_a_higher_cap_goes_on(
    protocol_model_path, tmp_path, capsys
):
    out = tmp_path / "run"
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        args = [
            *_train_args(protocol_model_path, tmp_path, server, out),
            "--max_steps",
            "6",
            "--save_steps",
            "100",
        ]
        code = cli_main([*args, "--max_env_calls", "10"])
        err = capsys.readouterr().err
        assert code == 4, err[-2000:]
        stopped = int(re.search(r"stopped after step (\d+) of 6", err).group(1))
        assert 1 <= stopped < 6
        steps = _logged(out, stopped)  # the checkpoint of the step it stopped after
        total = steps[-1]["env/total_calls"]
        assert total == sum(row["env/calls"] for row in steps) == len(server.requests_for("env"))
        assert total <= 10
        mean = sum(row["env/calls"] for row in steps[-3:]) / len(steps[-3:])
        assert total + mean > 10  # the next step would have passed the cap
        # Every step logged its cost; the step line that shows it is checked on its own below.
        assert all("env/cost" in row and "env/total_cost" in row for row in steps) and len(steps) == stopped
        assert (
            err.strip().splitlines()[-1].startswith("prompt-r1: stopped by the spend cap: max_env_calls 10")
        )

        # The same cap again: nothing runs, nothing is paid.
        assert cli_main([*args, "--max_env_calls", "10", "--resume"]) == 4
        assert "nothing run" in capsys.readouterr().err
        assert len(server.requests_for("env")) == total

        # A higher cap: the run goes on to its last step.
        assert cli_main([*args, "--max_env_calls", "1000", "--resume", "--save_steps", "1"]) == 0
        steps = _logged(out, 6)
        assert [row["step"] for row in steps] == list(range(1, 7))
        assert steps[-1]["env/total_calls"] == len(server.requests_for("env"))
        assert steps[-1]["env/total_cost"] == pytest.approx(sum(row["env/cost"] for row in steps))


def test_a_step_that_passes_the_cap_is_finished_not_cut(protocol_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        args = [
            *_train_args(protocol_model_path, tmp_path, server, out),
            "--max_steps",
            "3",
            "--save_steps",
            "100",
        ]
        code = cli_main([*args, "--max_env_calls", "2"])  # the first step's estimate (none) lets it start
        paid = len(server.requests_for("env"))
    err = capsys.readouterr().err
    assert code == 4, err[-2000:]
    (step,) = _logged(out, 1)
    # Every episode of the step made its call (4 episodes, one call each at most), past the cap: none was dropped.
    assert step["env/calls"] == paid == 4 > 2
    assert f"max_env_calls 2 reached: {paid} calls spent; stopped after step 1 of 3" in err


# -- a 2-process ZeRO-2 run killed in the middle of a step, then resumed -----------------------------------------


def _launch(args: list[str], cwd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    accelerate = Path(sys.executable).parent / "accelerate"
    command = [str(accelerate), "launch", "--main_process_port", str(port),
               "--config_file", str(ROOT / "training/accelerate/deepspeed_zero2.yaml"), "--num_processes", "2",
               "-m", "prompt_r1", *args]  # fmt: skip
    # Output to a file: a pipe nobody reads while the test waits would fill and stall the ranks.
    log = (cwd / f"launch-{port}.log").open("w")
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    process.log = Path(log.name)
    log.close()
    return process


def _tree(pid: int) -> list[int]:
    """The process and its descendants (the launcher's ranks run in sessions of their own, so a process group
    does not hold them)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [pid], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _kill(process: subprocess.Popen) -> None:
    """SIGKILL the launcher and every rank at once, as a lost machine would."""
    for pid in _tree(process.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait()


def _finish(process: subprocess.Popen, timeout: float = 600) -> str:
    try:
        process.wait(timeout=timeout)
    finally:
        if process.returncode is None:
            _kill(process)
    output = process.log.read_text()
    assert process.returncode == 0, output[-3000:]
    return output


def _ledger_rows(out: Path) -> list[tuple]:
    rows = []
    for path in sorted((out / "call_ledger").glob("rank-*.sqlite")):
        connection = sqlite3.connect(path)
        rows += [
            (path.name, *row) for row in connection.execute("SELECT step, episode, turn, request FROM calls")
        ]
        connection.close()
    return rows


def _bodies(requests) -> Counter:
    return Counter(
        json.dumps(r.body["messages"], sort_keys=True) for r in requests if r.completed_at is not None
    )


@pytest.mark.timeout(900)
def test_a_run_killed_mid_step_and_resumed_pays_no_call_twice_and_ends_with_the_same_weights(
    protocol_model_path, tmp_path
):
    import torch
    from safetensors.torch import load_file

    steps = ["--max_steps", "3", "--save_steps", "1", "--max_env_cost", "1000"]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        whole_log = _finish(
            _launch([*_train_args(protocol_model_path, tmp_path, server, whole), *steps], tmp_path)
        )
        uninterrupted = _bodies(server.requests)
    # The uninterrupted run is also the suite's ZeRO-2 training run of 2 processes without vLLM (test_training_runs.py
    # runs ZeRO-3): it trains its steps and moves the weights.
    assert "trained 3 steps" in whole_log
    start = load_file(protocol_model_path / "model.safetensors")
    trained = load_file(whole / "model.safetensors")
    assert any(not torch.equal(start[name], trained[name]) for name in start), "no parameter changed"
    reference = _ledger_rows(whole)
    assert {row[1] for row in reference} == {0, 1, 2}
    # Kill after every call of the first step and half of the second: the calls after that are held unanswered.
    answer = sum(1 for row in reference if row[1] == 0) + sum(1 for row in reference if row[1] == 1) // 2
    seen = []

    def hold_after(model, body):
        seen.append(1)
        return Fault("timeout", delay=300) if len(seen) > answer else None

    with ScriptedServer({"env": lambda body: NAME_RESPONSE}, fault_rule=hold_after) as server:
        process = _launch([*_train_args(protocol_model_path, tmp_path, server, broken), *steps], tmp_path)
        try:
            deadline = time.monotonic() + 600
            # Every answered call is in a ledger, a call is held, and step 1's checkpoint is whole: kill the run.
            while not (
                len(seen) > answer
                and len(_ledger_rows(broken)) == answer
                and (broken / "checkpoint-1/trainer_state.json").is_file()
            ):
                assert process.poll() is None, process.log.read_text()[-3000:]
                assert time.monotonic() < deadline, "the run never reached the middle of its second step"
                time.sleep(0.2)
        finally:
            _kill(process)
        assert not (broken / "checkpoint-2").exists()
        killed = _bodies(server.requests)
        server.fault_rule = None
        assert sum(killed.values()) == answer
        err = _finish(_launch([*_train_args(protocol_model_path, tmp_path, server, broken), *steps, "--resume"],
                              tmp_path))  # fmt: skip
        resumed = _bodies(server.requests) - killed
    assert "trained 3 steps" in err
    # No call paid twice: what the killed and the resumed run had answered is what the uninterrupted run had.
    assert killed + resumed == uninterrupted, (killed, resumed, uninterrupted)
    # ... call for call, step by step: the same keys (rank, step, episode, turn, request) were recorded.
    assert sorted(_ledger_rows(broken)) == sorted(reference)
    logged = _logged(broken, 3)
    assert logged[1]["env/replayed_calls"] == answer - sum(1 for row in reference if row[1] == 0) > 0
    # The replayed step's replies came from the ledger, its sampling from the step's seed: the same rewards and
    # losses step by step, and the same weights.
    signals = [
        [(row["step"], row["reward"], row["loss"]) for row in _logged(out, 3)] for out in (whole, broken)
    ]
    assert signals[0] == signals[1]
    after = load_file(broken / "model.safetensors")
    assert trained.keys() == after.keys()
    for name in trained:
        assert torch.equal(trained[name], after[name]), name


def test_the_step_line_ends_with_the_steps_cost_and_the_total():
    import io

    from transformers import TrainerControl, TrainerState

    from prompt_r1.training.shared.progress import StepLines

    stream = io.StringIO()
    lines, state = StepLines(stream), TrainerState(max_steps=6, global_step=2)
    lines.on_train_begin(None, state, TrainerControl())
    lines.on_log(
        None, state, TrainerControl(), logs={"reward": 0.5, "env/cost": 0.0123, "env/total_cost": 1.84}
    )
    assert stream.getvalue().rstrip("\n").endswith("$0.0123 this step, $1.84 total"), stream.getvalue()
