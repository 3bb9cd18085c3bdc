"""No secret in any file the product writes (issue 51, item 1): a password in an endpoint URL's user part, a
secret-named query parameter (`?api_key=…`), a key read from an environment variable and a hub token on the
command line never reach batch outputs, `NAME.manifest.json`, the summary, the `--env-cache` SQLite file (nor
replayed from one another run wrote), or a training run's `manifest.json`. Real scripted servers on 127.0.0.1,
real files and SQLite; secrets are drawn at random (hypothesis), so no fixed string can pass by luck."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import sys
import uuid
from pathlib import Path

import pytest
from batch_setup import cli_args
from helpers import rows_of, run_cli, tiny_grpo_config, write_questions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prompt_r1.testing.servers import ScriptedServer, echo_environment, relay_agent

# What a URL carries unencoded in its user part or query (RFC 3986's unreserved characters).
URL_SAFE = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~"
SECRET_PARAMS = [
    "api_key",
    "key",
    "token",
    "access_token",
    "password",
    "secret",
    "sig",
    "api-key",
    "x-api-key",
]


def secret_text() -> st.SearchStrategy[str]:
    # A fixed, unlikely prefix: a drawn secret never shows up in a file by chance (a timestamp, a count).
    return st.text(URL_SAFE, min_size=4, max_size=24).map(lambda s: f"Zq9{s}")


def checksum(key: str, reply_json: str) -> str:
    """A cache row's checksum, as prompt_r1.clients.response_cache computes it (of key and reply)."""
    return hashlib.blake2b(f"{key}\n{reply_json}".encode(), digest_size=16).hexdigest()


def files_holding(folder: Path, secrets: list[str]) -> list[str]:
    """Each file under `folder` (SQLite's -wal too) that holds one of `secrets`, also JSON-escaped."""
    found = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        for secret in secrets:
            if secret.encode() in data or json.dumps(secret)[1:-1].encode() in data:
                found.append(f"{path.name}: {secret}")
    return found


@pytest.fixture(scope="module")
def server():
    with ScriptedServer({"env": echo_environment(), "agent": relay_agent()}) as s:
        yield s


def with_user(url: str, user: str, password: str) -> str:
    return url.replace("http://", f"http://{user}:{password}@", 1)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    user=secret_text(), password=secret_text(), agent_password=secret_text(), query_value=secret_text(),
    param=st.sampled_from(SECRET_PARAMS), key=secret_text(), query_on_env=st.booleans(),
)  # fmt: skip
def test_a_batch_writes_no_secret_in_any_file(
    server,
    tmp_path_factory,
    monkeypatch,
    user,
    password,
    agent_password,
    query_value,
    param,
    key,
    query_on_env,
):
    folder = tmp_path_factory.mktemp("secrets")
    inp = write_questions(folder / "q.jsonl", 3)
    env_url = with_user(server.base_url, user, password)
    if query_on_env:  # a query the endpoint does not take: the rows fail, and their errors show the URL
        env_url += f"?{param}={query_value}"
    agent_url = with_user(server.base_url, "agent", agent_password)
    monkeypatch.setenv("HOSTILE_SECRET_KEY", key)
    args = cli_args(server.base_url, inp, folder / "out.jsonl", "--env-temperature", "0",
                    "--env-cache", folder / "cache.sqlite", "--summary", folder / "summary.json",
                    "--log-file", folder / "debug.log")  # fmt: skip
    args[args.index("--env-base-url") + 1] = env_url
    args[args.index("--agent-base-url") + 1] = agent_url
    args[args.index("--env-api-key-env") + 1] = "HOSTILE_SECRET_KEY"
    code, out, err = run_cli(args)
    assert code in (0, 1), err
    assert (folder / "out.manifest.json").exists()
    rows = rows_of(folder / "out.jsonl")
    assert len(rows) == 3 and (query_on_env or {r["status"] for r in rows} == {"answered"}), rows[0]
    # The cache is made with its first kept reply (issue 51, item 3): none when no environment call went through.
    assert (folder / "cache.sqlite").exists() == any(r["status"] == "answered" for r in rows)
    secrets = [password, agent_password, key] + ([query_value] if query_on_env else [])
    assert files_holding(folder, secrets) == []
    assert all(secret not in out + err for secret in secrets)


def test_a_cache_another_run_wrote_replays_no_secret(server, tmp_path, batch_key):
    """A cache written by an older version, or by another user sharing it, holds an endpoint with a password:
    its replies are replayed into this run's rows without it, and what this run stores holds none."""
    inp = write_questions(tmp_path / "q.jsonl", 2)
    cache = tmp_path / "cache.sqlite"
    first = cli_args(
        server.base_url, inp, tmp_path / "first.jsonl", "--env-temperature", "0", "--env-cache", cache
    )
    assert run_cli(first)[0] == 0
    password = f"pw-{uuid.uuid4().hex}"
    with sqlite3.connect(cache) as db:  # as another writer left it: a password in each reply, checksums right
        for key, reply in db.execute("SELECT key, reply FROM replies").fetchall():
            stored = {**json.loads(reply), "endpoint": f"http://ann:{password}@10.0.0.9/v1?token={password}"}
            text = json.dumps(stored)
            db.execute("UPDATE replies SET reply=?, checksum=? WHERE key=?", (text, checksum(key, text), key))
    second = cli_args(
        server.base_url, inp, tmp_path / "second.jsonl", "--env-temperature", "0", "--env-cache", cache
    )
    code, out, err = run_cli(second)
    assert code == 0, err
    calls = [t["environment_call"] for r in rows_of(tmp_path / "second.jsonl") for t in r["turns"]
             if t.get("environment_call")]  # fmt: skip
    assert calls and all(c["cached"] for c in calls)  # every reply came from the cache ...
    assert password not in (tmp_path / "second.jsonl").read_text()  # ... none with the password
    assert "http://***@10.0.0.9/v1?token=***" in {c["endpoint"] for c in calls}


def test_a_training_manifest_holds_no_url_secret_nor_hub_token(tmp_path, monkeypatch):
    from prompt_r1.training.shared.run_manifest import train_manifest

    password, query, token = (f"{what}-{uuid.uuid4().hex}" for what in ("pw", "q", "hf"))
    url = f"http://trainer:{password}@127.0.0.1:9/v1?api_key={query}"
    monkeypatch.setattr(sys, "argv", ["prompt-r1", "train", "--env-base-url", url, "--hub_token", token,
                                      f"--hub-token={token}", "--output_dir", str(tmp_path / "run")])  # fmt: skip
    train_manifest(tiny_grpo_config(tmp_path / "run", env_base_url=url, hub_token=token), resume=False)
    text = (tmp_path / "run" / "manifest.json").read_text()
    assert password not in text and query not in text and token not in text
    manifest = json.loads(text)
    assert manifest["command_line"][3:6] == ["http://***@127.0.0.1:9/v1?api_key=***", "--hub_token", "***"]
