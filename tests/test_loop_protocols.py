"""A protocol is an object (prompt_r1.loop.protocols): one per name the loop config accepts, each with that
config's rules, and no other module of the project branching on a protocol's name."""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

import pytest

from prompt_r1.core.config import PROTOCOL_RULES, PROTOCOLS, LoopConfig
from prompt_r1.core.errors import ConfigError
from prompt_r1.loop import protocols
from prompt_r1.loop.protocols import LoopProtocol, protocol_for
from prompt_r1.scoring.rewards import PRESETS

ROOT = Path(protocols.__file__).resolve().parents[3]
# A comparison with a protocol's name, or a flag standing for one: what the protocol objects replace.
BRANCH = re.compile(r"by_release|[!=]= \"release\"|protocol [!=]= ")


def protocol_branches(package: Path) -> list[str]:
    """`path:line` of each branch on a protocol's name outside the protocols' own modules."""
    found = []
    for path in sorted(package.rglob("*.py")):
        if "protocols" in path.relative_to(package).parts:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if BRANCH.search(line):
                found.append(f"{path.relative_to(package)}:{number}")
    return found


def test_each_protocol_the_config_accepts_is_an_object_with_its_rules():
    assert set(protocols.PROTOCOLS) == set(PROTOCOLS) == set(PROTOCOL_RULES)
    for name in PROTOCOLS:
        protocol = protocol_for(LoopConfig(protocol=name))
        assert isinstance(protocol, LoopProtocol) and protocol.name == name
        assert protocol.reward_preset in PRESETS
        assert LoopConfig(protocol=name).force_final_answer is PROTOCOL_RULES[name].asks_final_answer
    with pytest.raises(ConfigError, match="protocol must be one of paper, release, got 'verl'"):
        protocol_for("verl")


def test_no_module_outside_the_protocols_branches_on_a_protocols_name(tmp_path):
    assert protocol_branches(ROOT / "prompt_r1") == []
    # The check has teeth: the same tree with one branch planted.
    shutil.copytree(ROOT / "prompt_r1", tmp_path / "prompt_r1", ignore=shutil.ignore_patterns("__pycache__"))
    with (tmp_path / "prompt_r1" / "runs" / "episode.py").open("a", encoding="utf-8") as f:
        f.write('\nif loop.protocol == "release":  # planted\n    pass\n')
    assert protocol_branches(tmp_path / "prompt_r1") == [f"runs/episode.py:{_lines(tmp_path) - 1}"]


def _lines(root: Path) -> int:
    return len((root / "prompt_r1" / "runs" / "episode.py").read_text(encoding="utf-8").splitlines())


@pytest.mark.parametrize("module", ["graph.py", "nodes.py", "state.py"])
def test_the_loop_reads_in_one_sitting(module):
    """No function of the loop's wiring, nodes or state over 80 lines."""
    tree = ast.parse((ROOT / "prompt_r1" / "loop" / module).read_text(encoding="utf-8"))
    long = [
        f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 80
    ]
    assert long == []


@pytest.mark.parametrize("force_final_answer", [True, False])
def test_the_most_agent_turns_is_what_an_agent_that_never_answers_makes(force_final_answer):
    """The step lines log generation for every turn the loop allows (`most_agent_turns`): under the paper protocol
    a turn per call, the turn after the last reply, and the final-answer request; under release, `max_turns`."""
    from conftest import PROMPT

    from prompt_r1.loop.graph import build_graph
    from prompt_r1.testing.scripted import ScriptedAgent, ScriptedEnvironment, scripted_agent
    from prompt_r1.testing.servers import echo_environment

    loop = LoopConfig(max_turns=2, force_final_answer=force_final_answer)
    agent = ScriptedAgent(scripted_agent([PROMPT.format(k=k) for k in range(1, 10)]))
    build_graph(agent, ScriptedEnvironment(echo_environment()), loop=loop).invoke({"question": "Q?"})
    made = [request.turn for request in agent.requests]
    assert made == list(range(len(made))) and len(made) == protocol_for(loop).most_agent_turns(
        2, force_final_answer
    )
    assert len(made) == 2 + 1 + force_final_answer
    assert protocol_for(LoopConfig(protocol="release")).most_agent_turns(3, True) == 3
