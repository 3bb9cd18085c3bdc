"""`prompt-r1 train` trusts no damaged file and shares no output folder: an empty or cut call ledger, a ledger that
lost calls the checkpoint logged as paid, a checkpoint whose files do not read, and an output_dir another run
holds are each refused in one line naming the file, exit 2, before any environment call, with no file changed.

Real files damaged on disk, a real second process holding the folder, the real command in this process, a tiny
random agent (the refusals come before it would generate) and a scripted environment on 127.0.0.1 that counts
its requests.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from conftest import NAME_QUESTION, NAME_RESPONSE  # noqa: E402

from prompt_r1.cli.main import main as cli_main  # noqa: E402
from prompt_r1.clients.environment import EnvironmentReply  # noqa: E402
from prompt_r1.testing.servers import ScriptedServer  # noqa: E402
from prompt_r1.training.shared.ledger import CallKey, CallLedger, LedgerError, ledger_path  # noqa: E402
from prompt_r1.training.shared.resume import ResumeError, check_resume_checkpoint  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
IDENTITY = {"seed": 0, "processes": 1, "rank": 0, "environment_model": "env"}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _train(model: Path, tmp_path: Path, server: ScriptedServer, out: Path, *extra: str) -> list[str]:
    rows = tmp_path / "names.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"id": f"n{i}", "question": NAME_QUESTION, "golden_answers": ["Ada"]}) + "\n"
            for i in range(8)
        )
    )
    return ["train", "--config", str(ROOT / "training/configs/tiny-cpu.yaml"), "--model_name_or_path", str(model),
            "--train_data", str(rows), "--env-base-url", server.base_url, "--max_turn_tokens", "8",
            "--max_total_tokens", "48", "--max_steps", "1", "--save_steps", "1", "--output_dir", str(out),
            *extra]  # fmt: skip


def _refused(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("prompt-r1: error: "), err[-3000:]
    return last


def _ledger_with_calls(path: Path, calls: int) -> None:
    ledger = CallLedger.open(path, IDENTITY)
    for i in range(calls):
        ledger.record(
            CallKey(i, "train", 0, 0, 0, "h" * 32), EnvironmentReply("x" * 300, 1, 1, 1, 0.1, "env"), 0.1
        )
    ledger.connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # every row in the main file, as after a run
    ledger.close()


def test_an_empty_or_cut_ledger_is_refused_and_left_as_it_is(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    cut = tmp_path / "cut.sqlite"
    _ledger_with_calls(cut, 200)
    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])  # a copy or a disk that stopped half way
    for path, said in ((empty, "is empty (0 bytes)"), (cut, "not a readable call ledger")):
        before = path.read_bytes()
        with pytest.raises(LedgerError) as caught:
            CallLedger.open(path, IDENTITY)
        message = str(caught.value)
        assert said in message and str(path) in message and "\n" not in message, message
        assert "call_ledger false" in message  # a way on that does not restart the spend total
        assert path.read_bytes() == before  # not taken as new, not repaired
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(path.name)) == [path.name]


def test_a_write_ahead_log_without_its_ledger_is_refused(tmp_path):
    live = tmp_path / "live.sqlite"
    ledger = CallLedger.open(live, IDENTITY)  # open, as in a process killed mid-run: its calls are in the log
    ledger.record(CallKey(0, "train", 0, 0, 0, "h" * 32), EnvironmentReply("x", 1, 1, 1, 0.1, "env"), 0.1)
    lost = tmp_path / "lost.sqlite"
    (tmp_path / "lost.sqlite-wal").write_bytes((tmp_path / "live.sqlite-wal").read_bytes())
    ledger.close()
    with pytest.raises(LedgerError, match="lost.sqlite is missing but its write-ahead log lost.sqlite-wal"):
        CallLedger.open(lost, IDENTITY)
    assert not lost.exists()


def test_a_new_ledger_is_made_whole_then_renamed(tmp_path):
    path = tmp_path / "call_ledger" / "rank-00000.sqlite"
    (tmp_path / "call_ledger").mkdir()
    (path.parent / (path.name + ".creating")).write_bytes(b"left by a process killed while creating it")
    ledger = CallLedger.open(path, IDENTITY)
    assert ledger.totals()["calls"] == 0
    ledger.close()
    assert not (path.parent / (path.name + ".creating")).exists()
    CallLedger.open(path, IDENTITY).close()  # read back as a ledger


def test_a_checkpoint_whose_files_do_not_read_is_refused_naming_the_file(tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    good = tmp_path / "checkpoint-2"
    good.mkdir()
    (good / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": []}))
    save_file({"w": np.zeros((64, 64), dtype=np.float32)}, str(good / "model.safetensors"))
    check_resume_checkpoint(good)  # reads
    whole = (good / "model.safetensors").read_bytes()
    for name, data, said in (
        ("model.safetensors", b"garbage " * 100, "is not a whole safetensors file"),
        ("model.safetensors", whole[: len(whole) // 2], "is not a whole safetensors file"),
        ("model.safetensors", b"", "is empty"),
        ("optimizer.pt", b"PK\x03\x04 cut", "is not a whole torch file"),
        ("trainer_state.json", b'{"global_step": 2, "log_hi', "is not JSON"),
    ):
        folder = tmp_path / f"case-{len(list(tmp_path.iterdir()))}" / "checkpoint-2"
        folder.mkdir(parents=True)
        for path in good.iterdir():
            (folder / path.name).write_bytes(path.read_bytes())
        (folder / name).write_bytes(data)
        before = _snapshot(folder)
        with pytest.raises(ResumeError) as caught:
            check_resume_checkpoint(folder)
        message = str(caught.value)
        assert f"{folder / name} {said}" in message and "\n" not in message, message
        assert _snapshot(folder) == before


def test_train_refuses_an_empty_ledger_before_any_call(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    path = ledger_path(out, 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"")
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        code = cli_main(_train(tiny_model_path, tmp_path, server, out))
        assert server.requests_for("env") == []
    last = _refused(capsys)
    assert code == 2 and f"{path} is empty (0 bytes)" in last, last
    assert path.read_bytes() == b""


def test_train_refuses_fewer_rows_than_one_step_takes_before_any_call(tiny_model_path, tmp_path, capsys):
    """The sampler deals a step's prompts across the processes and drops a short batch: with fewer rows there is
    no step to run: 8 rows, and 36 episodes in groups of 4 take 9 prompts a step (N processes: 9N)."""
    out = tmp_path / "run"
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        code = cli_main(_train(tiny_model_path, tmp_path, server, out, "--per_device_train_batch_size", "36"))
        assert server.requests_for("env") == []
    last = _refused(capsys)
    assert code == 2 and last == (
        "prompt-r1: error: the training data has 8 rows, but one step takes 9 (per_device_train_batch_size 36 x 1 "
        "process x 1 / num_generations 4): add rows, or lower per_device_train_batch_size or the processes"
    )


def test_train_resume_refuses_a_garbage_checkpoint_in_one_line(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    checkpoint = out / "checkpoint-1"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 1, "log_history": []}))
    (checkpoint / "model.safetensors").write_bytes(b"\x00garbage\xff" * 500)
    before = _snapshot(out)
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        code = cli_main([*_train(tiny_model_path, tmp_path, server, out), "--resume"])
        assert server.requests_for("env") == []
    last = _refused(capsys)
    assert code == 2 and f"{checkpoint / 'model.safetensors'} is not a whole safetensors file" in last, last
    assert _snapshot(out) == before


def test_a_second_train_on_the_same_output_dir_is_refused(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    code = "import time\nfrom prompt_r1.runs.output_lock import hold_output\n"
    code += f"with hold_output({str(out)!r}, 'output_dir', folder=True):\n    print('held', flush=True)\n"
    code += "    time.sleep(300)\n"
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
            got = cli_main(_train(tiny_model_path, tmp_path, server, out))
            assert server.requests_for("env") == []
    finally:
        holder.kill()
        holder.wait()
    last = _refused(capsys)
    assert got == 2 and f"output_dir {out} is being written by another run (pid {holder.pid} on " in last, (
        last
    )
    assert [p.name for p in out.iterdir()] == [".prompt-r1.lock"]  # the holder's; nothing of the refused run


@pytest.mark.slow  # a real training step (~30 s on 2 cores); the ledger and checkpoint refusals above run by default
@pytest.mark.timeout(600)
def test_a_resumed_run_whose_ledger_lost_calls_is_refused_before_paying_again(
    protocol_model_path, tmp_path, capsys
):
    out = tmp_path / "run"
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        # An agent taught the protocol, so that a step pays for environment calls.
        args = _train(
            protocol_model_path, tmp_path, server, out, "--max_turn_tokens", "24", "--max_total_tokens", "96"
        )
        # A process of its own, which closes its ledger as it ends, as a run does.
        first = subprocess.run(
            [sys.executable, "-m", "prompt_r1", *args], cwd=ROOT, capture_output=True, text=True
        )
        assert first.returncode == 0, first.stderr[-3000:]
        paid = len(server.requests_for("env"))
        path = ledger_path(out, 0)
        state = json.loads((out / "checkpoint-1" / "trainer_state.json").read_text())
        logged = [row for row in state["log_history"] if "env/total_calls" in row][-1]["env/total_calls"]
        assert paid > 0 and logged == paid
        resume = [*args, "--max_steps", "2", "--resume"]

        path.write_bytes(b"")  # emptied: never a new ledger
        assert cli_main(resume) == 2
        assert f"{path} is empty (0 bytes)" in _refused(capsys)

        path.unlink()  # gone: a new, empty ledger would restart the spend total at $0
        assert cli_main(resume) == 2
        assert f"the call ledger {path} is missing, but checkpoint-1 logged {paid} paid calls" in _refused(
            capsys
        )
        assert not path.exists()

        CallLedger.open(path, IDENTITY).close()  # another, empty ledger in its place (or its calls lost)
        assert cli_main(resume) == 2
        last = _refused(capsys)
        assert f"{path} holds 0 calls, but step 1 (the checkpoint resumed from) logged {paid} paid" in last, (
            last
        )
        assert len(server.requests_for("env")) == paid  # nothing paid twice


def test_train_resume_names_a_changed_setting_in_one_line(tiny_model_path, tmp_path, capsys):
    """Through `prompt-r1 train`: a resume with another learning rate than the manifest's is refused before the
    model loads, naming it; nothing is written."""
    from prompt_r1.cli.train import train_parser
    from prompt_r1.training.shared.run_manifest import train_manifest

    out = tmp_path / "run"
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        args = _train(tiny_model_path, tmp_path, server, out)
        train_manifest(
            train_parser(args[1:]).parse_args_and_config(args[1:])[0], resume=False
        )  # the first run's
        (out / "checkpoint-1").mkdir()
        (out / "checkpoint-1" / "trainer_state.json").write_text(
            json.dumps({"global_step": 1, "log_history": []})
        )
        before = _snapshot(out)
        assert cli_main([*args, "--resume", "--learning_rate", "0.5"]) == 2
        assert server.requests_for("env") == []
    last = _refused(capsys)
    assert "learning_rate: 0.0001 → 0.5" in last and "--allow_changed_settings" in last, last
    assert _snapshot(out) == before


@pytest.mark.slow  # a real training step and its resume; the refusal above runs by default
@pytest.mark.timeout(900)
def test_train_resume_with_a_changed_setting_runs_when_allowed(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    with ScriptedServer({"env": lambda body: NAME_RESPONSE}) as server:
        args = _train(tiny_model_path, tmp_path, server, out)
        assert cli_main(args) == 0
        resume = [*args, "--resume", "--max_steps", "2", "--learning_rate", "0.5"]
        assert cli_main(resume) == 2 and "learning_rate: 0.0001 → 0.5" in _refused(capsys)
        assert cli_main([*resume, "--allow_changed_settings"]) == 0
    runs = json.loads((out / "manifest.json").read_text())["runs"]
    assert len(runs) == 2 and runs[-1]["changed"] == ["learning_rate: 0.0001 → 0.5"]
    assert (out / "checkpoint-2").is_dir()
