"""The protocol guide (agents/guide.py) on the built-in model's tokenizer, driven without a model: whatever the
scores favour, a guided turn is a well-formed prompt or answer that closes within the turn's budget."""

from __future__ import annotations

import pytest
import torch

from prompt_r1.core.protocol import parse_agent_output

TURN = 48  # the turn cap the built-in agent is guided under in the tests; 12 words a tag fit in it


@pytest.fixture(scope="module")
def tokenizer(builtin_cache):
    from transformers import AutoTokenizer

    from prompt_r1.agents.builtin import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))


def _drive(tokenizer, plans, favour, steps=TURN):
    """Greedy decoding of `steps` tokens through a ProtocolGuide, the raw scores of each step given by
    `favour(ids)` (rows × vocabulary; `ids`: the rows so far); the rows' texts."""
    from prompt_r1.agents.guide import ProtocolGuide

    prompt = tokenizer.encode("Where was Bram Tenny born?")
    guide = ProtocolGuide(tokenizer, plans, len(prompt), think_tokens=12, body_tokens=12)
    ids = torch.tensor([prompt] * len(plans))
    for _ in range(steps):
        chosen = guide(ids, favour(ids)).argmax(dim=-1, keepdim=True)
        ids = torch.cat([ids, chosen], dim=1)
    return [tokenizer.decode(row[len(prompt) :].tolist(), skip_special_tokens=False) for row in ids]


def _assert_well_formed(texts, plans):
    for text, plan in zip(texts, plans, strict=True):
        turn = parse_agent_output(text)
        close = "</interaction_prompt>" if plan == "prompt" else "</answer>"
        assert (turn.kind, turn.defects) == (plan, ()), text
        assert turn.text.endswith(close), text  # closed within the turn's tokens
        assert (turn.prompt or turn.answer).strip() and turn.think.strip(), text


def test_a_model_that_would_close_every_tag_at_once_still_writes_a_word_in_each(tokenizer):
    """The first token it favours closes the tag; the next, a blank line; then the end of the turn. A tag closed
    empty is a malformed turn (an empty prompt cannot be sent), so the guide makes it write a word first."""
    vocab = len(tokenizer)
    closing = {tokenizer.encode(tag)[0] for tag in ("</think>", "</interaction_prompt>", "</answer>")}
    blank = tokenizer.encode("\n")[0]

    def favour(ids):
        scores = torch.zeros((2, vocab))
        scores[:, list(closing)] = 30.0
        scores[:, blank] = 20.0
        scores[:, tokenizer.eos_token_id] = 10.0
        return scores

    plans = ["prompt", "answer"]
    _assert_well_formed(_drive(tokenizer, plans, favour), plans)


def test_pieces_of_a_character_that_join_into_a_blank_one_do_not_count_as_a_word(tokenizer):
    """Two byte-level tokens that together are a no-break space (blank), each read alone as a replacement
    character: a model that favours them in turn would fill its tags with blanks."""
    first, second = tokenizer.convert_tokens_to_ids(["\u00c2", "\u0142"])  # the bytes C2 A0
    assert tokenizer.decode([first, second]) == "\u00a0"
    vocab = len(tokenizer)

    def favour(ids):
        scores = torch.zeros((len(ids), vocab))
        for row, last in enumerate(ids[:, -1].tolist()):
            scores[row, second if last == first else first] = 30.0
            scores[row, [first, second]] += 20.0
        return scores

    plans = ["prompt", "answer"]
    _assert_well_formed(_drive(tokenizer, plans, favour), plans)


@pytest.mark.parametrize("seed", range(6))
def test_random_scores_that_favour_tags_blanks_and_ends_give_well_formed_turns(tokenizer, seed):
    """Random scores, with every token that holds "<", every blank token and the end of the turn raised by a
    random amount each step: each row is a well-formed prompt or answer within the turn's budget."""
    texts = {i: tokenizer.convert_tokens_to_string([t]) for t, i in tokenizer.get_vocab().items()}
    tags = [i for i, t in texts.items() if "<" in t]
    blanks = [i for i, t in texts.items() if not t.strip()]
    vocab = len(tokenizer)
    generator = torch.Generator().manual_seed(seed)
    plans = ["prompt", "answer", "prompt", "answer"]

    def favour(ids):
        scores = torch.randn((len(plans), vocab), generator=generator)
        for ids in (tags, blanks, [tokenizer.eos_token_id]):
            scores[:, ids] += 8.0 * torch.rand((len(plans), 1), generator=generator)
        return scores

    _assert_well_formed(_drive(tokenizer, plans, favour), plans)
