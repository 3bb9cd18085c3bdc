"""The loop: one episode as a LangGraph state machine, agent ⇄ environment ▸ finalize.

- `graph`: `build_graph`, the wiring of the state machine; `nodes`: its nodes and routers (`LoopNodes`);
  `state`: the episode's state and its reducers; `graph_runnables`: how the nodes are wrapped as runnables;
- `protocols`: what differs between the paper's loop and the reference release's rollout, one object per
  protocol behind one interface (`protocols.base.LoopProtocol`: what the agent is shown, how its output is
  parsed, the chat template, what the environment receives, how turns end, the reward preset), chosen once from
  `LoopConfig.protocol`: `protocols.paper` and `protocols.release` (`--protocol release`, with the release's
  chat template `release_chat_template.jinja`). No other module of the project branches on the protocol's name.

Add a protocol: subclass `LoopProtocol` in a new `protocols/<name>.py`, list it in `protocols.PROTOCOLS`, give its
config rules (force_final_answer's default, the least max_turns) in `prompt_r1.core.config.PROTOCOL_RULES`, and
add its reward preset to `prompt_r1.scoring.rewards.PRESETS` if it scores with its own.

May import: agents, clients, data, scoring, core.
"""
