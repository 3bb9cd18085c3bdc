"""The real-agent benchmark (evals/bench/real_agent.py) reuses what an earlier run under the same OUT finished: a
seed's GRPO run of the same settings, and each table row kept for the same weights, draw and settings. The stages
themselves (minutes to hours) are replaced here by stand-ins that count their calls: what is checked is when they
run again and that what is reused is what they gave."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import types

import pytest
from helpers import ROOT, load_script


@pytest.fixture
def bench():
    return load_script(ROOT / "evals" / "bench" / "real_agent.py", "real_agent")


def _weights(folder, value: float):
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file({"w": torch.full((4,), value)}, folder / "model.safetensors")
    (folder / "config.json").write_text("{}")
    return str(folder)


def _kept(bench, out, **changes):
    environment = out.parent / "environment"
    if not environment.is_dir():
        _weights(environment, 9.0)
    settings = dict(eval_seed=7, questions=4, turn_tokens=48, budget=16, loop={"max_turns": 3},
                    environment=str(environment))  # fmt: skip
    return bench.KeptRows(out, **{**settings, **changes})


ROW = {"calls_needed": 1, "calls": 1, "em": 1.0, "f1": 1.0, "tokens": 9, "status": "answered"}


def test_kept_rows_are_found_only_for_what_decides_them(bench, tmp_path):
    one, two = _weights(tmp_path / "one", 1.0), _weights(tmp_path / "two", 2.0)
    kept = _kept(bench, tmp_path)
    assert kept.put(kept.key("agent", one), {"rows": [ROW]})
    assert kept.put(kept.key("opro"), {"rows": [ROW], "search": {"instruction": "x", "calls": {"failed": 0}}})
    assert kept.get(kept.key("agent", one)) == {"rows": [ROW]}
    assert kept.get(kept.key("opro"))["search"]["instruction"] == "x"
    assert kept.get(kept.key("agent", two)) is None  # other weights
    assert kept.get(kept.key("agent", one, withheld=True)) is None
    assert kept.get(kept.key("direct")) is None
    _weights(tmp_path / "one", 3.0)  # the same folder, retrained
    assert kept.get(kept.key("agent", one)) is None
    _weights(tmp_path / "one", 1.0)
    (tmp_path / "one" / "chat_template.jinja").write_text("{{ messages }}")  # another template, same weights
    assert kept.get(kept.key("agent", one)) is None
    (tmp_path / "one" / "chat_template.jinja").unlink()
    other_env = _weights(tmp_path / "other-environment", 8.0)
    changes = ({"eval_seed": 8}, {"questions": 5}, {"turn_tokens": 64}, {"loop": {"max_turns": 2}},
               {"environment": other_env})  # fmt: skip
    for change in changes:
        other = _kept(bench, tmp_path, **change)
        assert other.get(other.key("agent", one)) is None, change
    assert kept.get(kept.key("agent", one)) == {"rows": [ROW]}  # still there for the same
    # The search budget decides OPRO's and GEPA's rows, not the others'.
    kept.put(kept.key("direct"), {"rows": [ROW]})
    cheaper = _kept(bench, tmp_path, budget=8)
    assert cheaper.get(cheaper.key("opro")) is None and cheaper.get(cheaper.key("direct")) == {"rows": [ROW]}
    assert not list(kept.folder.glob("*.part"))
    # Failures are not kept: the next run computes them again.
    assert not kept.put(
        kept.key("gepa"), {"rows": [ROW], "search": {"instruction": "y", "calls": {"failed": 2}}}
    )
    assert not kept.put(kept.key("agent", two), {"rows": [ROW, {**ROW, "status": "environment_error"}]})
    assert kept.get(kept.key("gepa")) is None and kept.get(kept.key("agent", two)) is None
    # A folder with no weights is no model to key rows by.
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no model weights"):
        kept.key("agent", str(tmp_path / "empty"))


def test_a_second_table_computes_only_the_rows_it_lacks(bench, tmp_path, monkeypatch):
    from prompt_r1.agents import local, model_server

    calls = []

    @contextlib.contextmanager
    def server(model, seed):
        yield types.SimpleNamespace(name="env", base_url="http://127.0.0.1:9/v1")

    class Agent:
        def __init__(self, config, model=None, tokenizer=None):
            calls.append(("load", config.model, config.guide_calls, model))  # model: weights loaded before
            self.model, self.tokenizer, self.guide_calls = config.model, None, config.guide_calls

    async def env_method(client, questions, instruction=""):
        calls.append(("env", instruction))
        return [{"calls_needed": 1, "calls": 1, "em": 0.0, "f1": 0.1, "tokens": 9}]

    async def search_instruction(method, client, budget, seed):
        calls.append((method, budget))
        return {"instruction": f"{method} says", "score": 0.1, "metric_calls": budget, "calls": {"failed": 0}}

    async def agent_method(agent, client, questions, loop, withheld=False):
        calls.append(("agent", agent.model, withheld, agent.guide_calls))
        em = 0.0 if withheld else 1.0
        return [{"calls_needed": 2, "calls": 2, "em": em, "f1": em, "tokens": 99}]

    monkeypatch.setattr(model_server, "model_server_in_thread", server)
    monkeypatch.setattr(local, "TransformersAgent", Agent)
    monkeypatch.setattr(bench, "env_method", env_method)
    monkeypatch.setattr(bench, "search_instruction", search_instruction)
    monkeypatch.setattr(bench, "agent_method", agent_method)
    args = argparse.Namespace(questions=4, eval_seed=7, turn_tokens=48)
    cold, trained = _weights(tmp_path / "cold", 1.0), _weights(tmp_path / "trained", 2.0)
    agents = {"untrained": cold, "trained": trained}

    first = asyncio.run(bench.compare(args, agents, 16, _kept(bench, tmp_path / "out")))
    assert first["reused"] == []
    envs = [c for c in calls if c[0] == "env"]
    assert envs == [("env", ""), ("env", bench.INSTRUCTION), ("env", "opro says"), ("env", "gepa says")]
    assert ("opro", 16) in calls and ("gepa", 16) in calls
    assert [c for c in calls if c[0] == "agent"] == [
        ("agent", cold, False, None), ("agent", trained, False, None), ("agent", trained, True, None),
        ("agent", trained, False, 0),  # answering at once: its first turn guided into the answer's tags
    ]  # fmt: skip
    # Each agent's weights are loaded once: the guided one shares the trained one's.
    assert [c for c in calls if c[0] == "load"] == [("load", cold, None, None), ("load", trained, None, None),
                                                    ("load", trained, 0, trained)]  # fmt: skip
    calls.clear()
    again = asyncio.run(bench.compare(args, agents, 16, _kept(bench, tmp_path / "out")))
    assert calls == []  # nothing computed, no agent loaded
    # (the tables through JSON: a kind with no question has NaN figures, which never compare equal)
    assert again["rows"] == first["rows"] and json.dumps(again["table"]) == json.dumps(first["table"])
    assert again["instructions"] == first["instructions"]
    assert again["reused"] == [
        *bench.BASELINES, "untrained", "trained", "trained, notes withheld", "trained, answering at once"
    ]  # fmt: skip
    # A second seed's agents: only their rows are computed.
    more = {**agents, "untrained 2": _weights(tmp_path / "cold2", 3.0), "trained 2": trained}
    third = asyncio.run(bench.compare(args, more, 16, _kept(bench, tmp_path / "out")))
    assert calls == [
        ("load", str(tmp_path / "cold2"), None, None),
        ("agent", str(tmp_path / "cold2"), False, None),
    ]
    assert third["rows"]["trained 2"] == first["rows"]["trained"]  # the same weights: the same row
    # Rows kept before the control answering at once existed (keyed by weights and withheld alone) are reused: only
    # the new row is computed.
    calls.clear()
    earlier = _kept(bench, tmp_path / "earlier")
    for model, withheld in ((cold, False), (trained, False), (trained, True)):
        earlier.put({"method": "agent", "weights": bench.model_digest(model), "turn_tokens": 48, "withheld": withheld},
                    {"rows": [ROW]})  # fmt: skip
    for method in bench.BASELINES:
        search = {"instruction": "x", "score": 0.1, "metric_calls": 16, "calls": {"failed": 0}}
        earlier.put(earlier.key(method), {"rows": [ROW], "search": search})
    asyncio.run(bench.compare(args, agents, 16, earlier))
    assert calls == [("load", trained, 0, None), ("agent", trained, False, 0)]


def test_a_finished_grpo_run_of_the_same_settings_is_reused(bench, tmp_path, monkeypatch):
    from prompt_r1.tasks import notes_agent, notes_async, notes_training

    trained = []

    class Trainer:
        def __init__(self, config, rows):
            self.config = config
            self.state = types.SimpleNamespace(log_history=[{"step": 1, "reward": 0.5}])
            self.processing_class = types.SimpleNamespace(save_pretrained=lambda path: None)
            self.model = types.SimpleNamespace(
                merge_and_unload=lambda: types.SimpleNamespace(save_pretrained=_save)
            )

        def train(self):
            trained.append(self.config["max_steps"])

    def _save(path):
        _weights(path, float(len(trained)))

    made = {
        "steps": 16,
        "ask_again": 0.5,
        "kinds": True,
        "plans": False,
        "replies": "scripted",
        "seconds": 60.0,
    }
    monkeypatch.setattr(bench, "cold_start_once", lambda seed, args, cold: dict(made))
    monkeypatch.setattr(notes_training, "grpo_config", lambda run, model, seed, **settings: settings)
    monkeypatch.setattr(notes_training, "notes_trainer", Trainer)
    monkeypatch.setattr(notes_agent, "save_adapter", lambda model, path, facts: None)
    args = argparse.Namespace(steps=2, generations=8, turn_tokens=64, async_grpo=False)

    first = bench.train_seed(3, args, tmp_path)
    assert trained == [2] and first["trained_model"] == str(tmp_path / "seed-3" / "grpo" / "model")
    again = bench.train_seed(3, args, tmp_path)
    assert trained == [2]  # reused: the record it kept, marked as reused
    assert again == {**json.loads(json.dumps(first, default=str)), "reused": True}
    # OUT moved: the reused run's folders are where they are now.
    moved = tmp_path.parent / f"{tmp_path.name}-moved"
    tmp_path.rename(moved)
    assert bench.train_seed(3, args, moved)["cold_model"] == str(moved / "seed-3" / "cold" / "model")
    assert trained == [2]
    moved.rename(tmp_path)
    made["ask_again"] = 0.7  # another cold start: trained again
    bench.train_seed(3, args, tmp_path)
    assert trained == [2, 2]
    for change in ({"steps": 3}, {"generations": 4}, {"turn_tokens": 80}):  # each trains again
        before = len(trained)
        args = argparse.Namespace(**{**vars(args), **change})
        bench.train_seed(3, args, tmp_path)
        assert len(trained) == before + 1 and trained[-1] == args.steps, change
    count = len(trained)
    (tmp_path / "seed-3" / "grpo" / "model" / "config.json").unlink()  # the model gone: trained again
    bench.train_seed(3, args, tmp_path)
    assert len(trained) == count + 1

    # The asynchronous trainer's run is its own folder, reused alike, with its training minutes kept.
    async_trained = []

    def train_async(model, rows, run, seed, **settings):
        async_trained.append(run.name)
        return {"trainer": Trainer(settings, rows), "seconds": 120.0}

    monkeypatch.setattr(notes_async, "train_async", train_async)
    args = argparse.Namespace(**{**vars(args), "async_grpo": True})
    first = bench.train_seed(3, args, tmp_path)
    assert (
        async_trained == ["grpo-async"]
        and first["trainer"] == "async"
        and first["minutes"]["training"] == 2.0
    )
    again = bench.train_seed(3, args, tmp_path)
    assert async_trained == ["grpo-async"] and again["minutes"] == first["minutes"] and again["reused"]
    assert len(trained) == count + 1  # the synchronous run untouched


@pytest.mark.parametrize(
    ("flags", "said"),
    [(["--seed-list", "3,x"], "seeds are whole numbers separated by commas, got '3,x'"),
     (["--seed-list", "3,4,3"], "a seed is named twice in '3,4,3'"),
     (["--seed-list", "3,4", "--seed0", "1"], "--seed-list names the seeds: give it without --seed0 and --seeds"),
     (["--seed-list", "3,4", "--seeds", "2"], "--seed-list names the seeds: give it without --seed0 and --seeds"),
     (["--eval-only", "--seed-list", "3"], "--seed-list: settings of training, which --eval-only does not do")],
)  # fmt: skip
def test_a_seed_list_is_refused_when_it_is_not_one(bench, flags, said, capsys):
    with pytest.raises(SystemExit) as stopped:
        bench.main(flags)
    assert stopped.value.code == 2 and said in capsys.readouterr().err


def test_a_seed_list_trains_those_seeds_and_each_is_held_to_its_own_cold_start(bench, tmp_path, monkeypatch):
    trained = []

    def train_seed(seed, args, out):
        trained.append(seed)
        series = {"step": [], **{key: [] for _, key in bench.CURVES}}
        return {"seed": seed, "cold_model": f"c{seed}", "trained_model": f"t{seed}", "series": series}

    def figures(em_2):
        names = (
            "em",
            "f1",
            "em_1",
            "em_2",
            "f1_1",
            "f1_2",
            "calls",
            "calls_1",
            "calls_2",
            "tokens",
            "at_once",
        )
        return {**dict.fromkeys(names, 0.0), "em": em_2, "em_2": em_2}

    # Seed 9's cold start is far better than seed 4's: each trained agent is held to its own.
    ems = {"untrained 4": 10.0, "trained 4": 30.0, "untrained 9": 40.0, "trained 9": 50.0}

    async def compare(args, agents, budget, kept):
        assert list(agents) == ["untrained 4", "trained 4", "untrained 9", "trained 9"]
        controls = [
            f"trained {seed}, {c}" for seed in (4, 9) for c in ("notes withheld", "answering at once")
        ]
        names = [*bench.BASELINES, *agents, *controls]
        return {"table": {name: figures(ems.get(name, 0.0)) for name in names}}

    said = []
    monkeypatch.setattr(bench, "train_seed", train_seed)
    monkeypatch.setattr(bench, "compare", compare)
    monkeypatch.setattr(bench, "say", said.append)
    assert bench.main(["--seed-list", "4,9", "--seed", "7", "--out", str(tmp_path)]) == 0
    assert trained == [4, 9]
    lines = [line for line in said if line.startswith("seed ")]
    assert lines[0].startswith("seed 4: 2-call EM 30.0 vs best untrained 10.0 + 15 (met)")
    assert lines[1].startswith("seed 9: 2-call EM 50.0 vs best untrained 40.0 + 15 (NOT met)")
    # ... and the stricter reading beside it: against the best cold start of any seed.
    assert lines[0].endswith(
        "against every seed's cold start: 2-call 40.0 + 15 (NOT met), overall 40.0 (NOT met)"
    )
    figures_file = json.loads((tmp_path / "real_agent.json").read_text())
    assert figures_file["seeds"] == [4, 9] and figures_file["seeds_from"] == "listed"
    assert figures_file["eval_seed_from"] == "named" and figures_file["reused_runs"] == []
