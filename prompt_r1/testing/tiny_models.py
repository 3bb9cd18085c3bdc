"""Tiny local models for tests, examples and benchmarks, built in-process and loaded through `from_pretrained`.

`build_tiny_model` writes a random Qwen2-style model and a byte-level BPE tokenizer trained here (with a chat
template) to a folder; `build_protocol_model` fine-tunes one to play the protocol's format. Nothing comes from a
hub. Needs the `dev` extra (tokenizers).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "CHAT_TEMPLATE",
    "QWEN3_ADDED_TOKENS",
    "QWEN3_SPECIAL_TOKENS",
    "build_protocol_model",
    "build_tiny_model",
    "episode_rows",
]

# Given an agent turn's text, the (start, end) character spans of it that are not training targets.
UntrainedSpans = Callable[[str], Sequence[tuple[int, int]]]


CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

# Qwen3's added tokens in its order: these are special (dropped by decode(skip_special_tokens=True)) ...
QWEN3_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# ... and these are not: one token each, but kept in decoded text (the reward's patterns read <think>).
QWEN3_ADDED_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)

_TINY_CORPUS = [
    "<think>The question asks about a person.</think><interaction_prompt>Who is the person in the question?</interaction_prompt>",
    "<interaction_response>The person is Ada Lovelace.</interaction_response>",
    "<think>The response names her.</think><answer>Ada Lovelace</answer>",
    "Question: Who wrote the first program? First, provide a simple explanation of the question.",
]


def build_tiny_model(
    path: str | Path,
    *,
    hidden_size: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int | None = None,
    vocab_size: int = 512,
    seed: int = 0,
    corpus: Sequence[str] = (),
    added_tokens: Sequence[str] = (),
    qwen3_tokens: bool = False,
    chat_template: str = CHAT_TEMPLATE,
) -> Path:
    """Save a random Qwen2 model and a byte-level BPE tokenizer (trained here, with a chat template) to `path`.

    Everything is built in-process; loading it back uses the ordinary `from_pretrained` path. The defaults make a
    model of a few thousand parameters for tests; the GPU benchmark asks for one of a few hundred million.
    `corpus`: more text for the tokenizer to learn from (a task's words then become single tokens).
    `added_tokens`: strings that become one token each wherever they occur (tags, a fixed instruction).
    `qwen3_tokens`: the tokenizer gets Qwen3's special and added tokens, special or not as in Qwen3
    (`<think>` one token, kept by decoding); `chat_template`: the template it is saved with.
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    specials = list(QWEN3_SPECIAL_TOKENS) if qwen3_tokens else ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator([*_TINY_CORPUS, *corpus] * 20, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    if qwen3_tokens:
        tokenizer.add_special_tokens({"additional_special_tokens": specials[3:]})
        tokenizer.add_tokens(list(QWEN3_ADDED_TOKENS))
    tokenizer.add_tokens(list(added_tokens))
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(path)

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = config.eos_token_id
    model.generation_config.pad_token_id = config.pad_token_id
    model.save_pretrained(path)
    return path


def build_protocol_model(
    path: str | Path,
    episodes: Sequence[tuple[Any, ...]],
    *,
    hidden_size: int = 64,
    steps: int = 400,
    lr: float = 3e-3,
    seed: int = 0,
    device: str = "cpu",
    corpus: Sequence[str] = (),
    added_tokens: Sequence[str] = (),
    batch_size: int | None = None,
    start_from: str | Path | None = None,
    protocol: str = "paper",
    decay: bool = False,
    untrained: UntrainedSpans | None = None,
    more: Sequence[tuple[Sequence[tuple[Any, ...]], UntrainedSpans | None]] = (),
    **model_shape: int,
) -> Path:
    """A tiny model fine-tuned (seconds, on CPU) to play scripted episodes, saved to `path`.

    Each episode is (question, first turn, environment response, second turn), or (question, turn, None, None)
    for one that answers at once, or for longer episodes (question, [turn, response, turn, response, ..., turn]):
    agent turns and environment responses alternating, ending on an agent turn. The model is trained on the
    token-exact trajectory the graph builds (agent turns as targets, the rendered environment message masked), so
    sampling through the graph reproduces the script; where several episodes share a question and first turn but
    end differently, the model learns to choose among their endings. `model_shape` (layers, heads, kv_heads,
    intermediate_size), `corpus` and `added_tokens` go to `build_tiny_model`; `batch_size`: episodes per step
    (unset: all); `start_from`: fine-tune that model folder further instead of a new random model; `device` is
    where the fine-tuning runs (the model is saved in float32 either way); `protocol`: the stream is the one
    the graph builds under that protocol (`release`: the release's tools prompt, every turn ending on the
    end-of-turn token, the response as the release's JSON observation, the second turn after its `<think>\n`);
    `decay`: the learning rate falls linearly from `lr` to 0 over the steps, so the model saved is where the
    optimiser settled rather than wherever a constant rate's last step left it; `untrained`: given an agent
    turn's text, the character spans (start, end) that are in the stream but not targets (a guessed word the
    model should not learn to prefer; the end-of-turn token after a turn stays a target); `more`: further
    (episodes, untrained) sets, trained in the same batches with their own untrained spans (rows that train one
    skill alone, beside the others).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if start_from is None:
        path = build_tiny_model(
            path, hidden_size=hidden_size, seed=seed, corpus=corpus, added_tokens=added_tokens, **model_shape
        )
    tok = AutoTokenizer.from_pretrained(start_from or path)
    model = AutoModelForCausalLM.from_pretrained(start_from or path).to(device)
    rows, labels = zip(
        *(
            row
            for part, spans in [(episodes, untrained), *more]
            for row in episode_rows(tok, part, protocol=protocol, untrained=spans)
        ),
        strict=True,
    )
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id)
    target = torch.full((len(rows), width), -100)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (row, label) in enumerate(zip(rows, labels, strict=True)):
        ids[i, : len(row)] = torch.tensor(row)
        target[i, : len(label)] = torch.tensor(label)
        attention[i, : len(row)] = 1
    ids, target, attention = ids.to(device), target.to(device), attention.to(device)
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 1 - step / max(steps, 1) if decay else 1.0
    )
    model.train()
    for _ in range(steps):
        # A random batch of `batch_size` episodes per step (all of them when unset).
        batch = torch.randperm(len(ids))[:batch_size] if batch_size else slice(None)
        loss = model(input_ids=ids[batch], attention_mask=attention[batch], labels=target[batch]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    model.to("cpu").save_pretrained(path)
    if start_from is not None:
        tok.save_pretrained(path)
    return Path(path)


def episode_rows(
    tok: Any,
    episodes: Sequence[tuple[Any, ...]],
    *,
    protocol: str = "paper",
    untrained: UntrainedSpans | None = None,
) -> list[tuple[list[int], list[int]]]:
    """Each episode (as `build_protocol_model` takes them) as (token ids, labels): the token-exact stream the graph
    builds under `protocol`, the agent's turns as targets, the prompt and the environment's rendered replies -100,
    and so are the tokens overlapping a span `untrained` gives for their turn."""
    from prompt_r1.clients.environment import EnvironmentReply
    from prompt_r1.loop.protocols import protocol_for

    stream = protocol_for(protocol)

    def response_ids(text: str, row: list[int]) -> list[int]:
        # The environment's reply as the graph appends it under the protocol (rendered, masked).
        reply = EnvironmentReply(text, input_tokens=0, output_tokens=0, attempts=1, latency_s=0.0)
        state = {"turns": [{"index": 0}], "completion_ids": row}
        return stream.observe(state, reply, tok, max_total_tokens=1 << 30)[0]["completion_ids"]

    def turn_ids(text: str, last: bool) -> tuple[list[int], list[int]]:
        # A turn that ends the episode ends on the end-of-turn token, and so does every turn of a protocol with
        # no stop strings (it is sampled and kept); a stop string ends the others.
        encoded = tok(text, add_special_tokens=False, return_offsets_mapping=bool(untrained))
        ids = list(encoded["input_ids"])
        labels = list(ids)
        if untrained:
            spans = untrained(text)
            for i, (start, end) in enumerate(encoded["offset_mapping"]):
                if any(start < b and a < end for a, b in spans):
                    labels[i] = -100
        if last or not stream.stop:
            return ids + [tok.eos_token_id], labels + [tok.eos_token_id]
        return ids, labels

    out = []
    for episode in episodes:
        if len(episode) == 2:  # (question, [turn, response, ..., turn]): any number of environment calls
            question, script = episode
        else:  # (question, turn, response, turn), or (question, turn, None, None): answered at once
            question, turn1, response, turn2 = episode
            script = [turn1] if response is None else [turn1, response, turn2]
        if len(script) % 2 != 1:
            raise ValueError("a multi-call episode is turns and responses ending on a turn")
        prompt = stream.first_prompt_ids(tok, question)
        row, label = list(prompt), [-100] * len(prompt)
        for k, text in enumerate(script):
            if k % 2:  # an environment response: rendered after the agent's turn, never a target
                env = response_ids(text, row)
                row, label = row + env, label + [-100] * len(env)
            else:
                ids, targets = turn_ids(text, last=k == len(script) - 1)
                row, label = row + ids, label + targets
        out.append((row, label))
    return out
