"""Guided turns: constrained decoding that keeps an untrained agent inside the protocol's tags.

A pretrained instruct model that was never trained on the protocol seldom writes `<think>…</think>` followed by
`<interaction_prompt>…</interaction_prompt>` by itself, so its episodes end at the first turn as format errors. A
guided turn is still the model's own sampling, with one constraint, as a grammar-constrained decoder would apply
it: the tags are written for it, the words between them are its own.

    <think> (the model's words, at most `think_tokens`) </think>
    <interaction_prompt> (its words, at most `body_tokens`) </interaction_prompt>     while replies < calls
    <answer> (its words) </answer>                                                   after `calls` replies

Inside a tag the model may close it itself once it has written a word (a tag left blank is a malformed turn: an
empty prompt cannot be sent); it may not open another tag (no token holding "<" but the ones that begin the
closing tag) or end the turn early (no end-of-sequence), nor write more than one blank token, or a piece of a
character (which could join into a blank one), before its first word; when its budget runs out the closing tag
is written for it. The sampled ids are kept as they were generated (forced ones included), so a guided episode's
trajectory is as token-exact as any other. Guiding is for seeing and testing the loop with a base model
(`--agent-guide-calls N`); training never guides the policy, since the format is what the reward teaches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import LogitsProcessor

from prompt_r1.core.prompts import FINAL_ANSWER_REQUEST
from prompt_r1.core.protocol import ANSWER_CLOSE, ANSWER_OPEN, PROMPT_CLOSE, PROMPT_OPEN

__all__ = ["ProtocolGuide", "guided_plan"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
RESPONSE_CLOSE = (
    "</interaction_response>"  # the instruction template names the opening tag, never the closing one
)


def guided_plan(tokenizer: Any, prompt_ids: list[int], calls: int) -> str:
    """ "prompt" while the conversation in `prompt_ids` holds fewer than `calls` environment replies and the loop has
    not asked for the final answer; "answer" after."""
    text = tokenizer.decode(prompt_ids[-4096:], skip_special_tokens=False)
    replies = text.count(RESPONSE_CLOSE)
    asked_to_answer = FINAL_ANSWER_REQUEST[:60] in text[-2000:]  # the loop's request, the latest message
    return "answer" if replies >= calls or asked_to_answer else "prompt"


@functools.lru_cache(maxsize=8)
def _vocabulary(tokenizer: Any) -> tuple[dict[int, str], dict[int, str], list[int], list[int]]:
    """(every token id's text, those holding "<": the only ones that can start a tag, the blank ones, the pieces
    of a character: pieces may join into a blank character), read once per tokenizer."""
    to_text = tokenizer.convert_tokens_to_string
    texts = {i: to_text([t]) for t, i in tokenizer.get_vocab().items()}
    tags = {i: t for i, t in texts.items() if "<" in t}
    return (
        texts,
        tags,
        [i for i, t in texts.items() if not t.strip()],
        [i for i, t in texts.items() if "\ufffd" in t],
    )


def _continues(written: str, close: str) -> bool:
    """Whether `written` (a tag begun with "<") is on its way to `close`, or is `close` with blank space after."""
    return close.startswith(written) or (written.startswith(close) and not written[len(close) :].strip())


@dataclass
class _Row:
    segments: list[
        tuple[str, str, int]
    ]  # (kind "force"/"free", text: the tag to write or the one that closes, budget)
    index: int = 0
    forced: list[int] = field(default_factory=list)  # ids still to write in a "force" segment
    free_ids: list[int] = field(default_factory=list)  # ids sampled in the current "free" segment


class ProtocolGuide(LogitsProcessor):
    """The constraint for one batched `generate` call: `plans[row]` is "prompt" or "answer" (see the module doc)."""

    def __init__(self, tokenizer: Any, plans: list[str], prompt_len: int, *, think_tokens: int = 48,
                 body_tokens: int = 64) -> None:  # fmt: skip
        self.tokenizer, self.prompt_len = tokenizer, prompt_len
        self.rows = []
        for plan in plans:
            open_tag, close_tag = (
                (PROMPT_OPEN, PROMPT_CLOSE) if plan == "prompt" else (ANSWER_OPEN, ANSWER_CLOSE)
            )
            self.rows.append(_Row([("force", THINK_OPEN, 0), ("free", THINK_CLOSE, think_tokens),
                                   ("force", open_tag, 0), ("free", close_tag, body_tokens)]))  # fmt: skip
        self.ids_of = {}  # a tag's token ids, encoded once
        self.texts, self.no_open_tag, self.blank, self.pieces = _vocabulary(tokenizer)
        self.vocab_end = max(self.texts) + 1  # ids from here on (a padded vocabulary's) have no text
        eos = tokenizer.eos_token_id
        self.ends = {eos} if eos is not None else set()
        self.ends |= set(getattr(tokenizer, "all_special_ids", []) or [])
        for row in self.rows:
            self._enter(row)

    def _tag_ids(self, text: str) -> list[int]:
        if text not in self.ids_of:
            self.ids_of[text] = list(self.tokenizer.encode(text, add_special_tokens=False))
        return self.ids_of[text]

    def _enter(self, row: _Row) -> None:
        """Set up the row's current segment."""
        if row.index < len(row.segments) and row.segments[row.index][0] == "force":
            row.forced = list(self._tag_ids(row.segments[row.index][1]))
        row.free_ids = []

    def _advance(self, row: _Row, token: int) -> None:
        """Account for the token the row just sampled."""
        if row.index >= len(row.segments):
            return
        kind, text, budget = row.segments[row.index]
        if kind == "force":
            row.forced.pop(0)
            if not row.forced:
                row.index += 1
                self._enter(row)
            return
        row.free_ids.append(token)
        written = self.tokenizer.decode(row.free_ids, skip_special_tokens=False)
        if text in written:  # the model closed the tag itself
            row.index += 1
            self._enter(row)
        elif len(row.free_ids) >= budget:  # out of budget: the closing tag is written for it
            row.segments[row.index] = ("force", text, 0)
            row.forced = list(self._tag_ids(text))
            # A closing tag written after part of itself would repeat it: continue from what was written.
            for k in range(len(text) - 1, 0, -1):
                if written.endswith(text[:k]):
                    rest = self._tag_ids(text[k:])
                    row.forced = list(rest)
                    break

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        step = input_ids.shape[1] - self.prompt_len
        for r, row in enumerate(self.rows):
            if step > 0:
                self._advance(row, int(input_ids[r, -1]))
            if row.index >= len(row.segments):
                continue  # done: the stop string ends the row
            kind, text, _ = row.segments[row.index]
            if kind == "force":
                keep = row.forced[0]
                value = scores[r, keep].clone()
                scores[r, :] = float("-inf")
                scores[r, keep] = value if torch.isfinite(value) else 0.0
                continue
            # Free: no end of turn, no tag opened but the closing one (a token that could begin it is allowed).
            written = self.tokenizer.decode(row.free_ids, skip_special_tokens=False) if row.free_ids else ""
            opened = written.rfind("<")
            partial = written[opened:] if opened >= 0 and ">" not in written[opened:] else ""
            if partial:  # the closing tag is being written: only what continues it (never another tag)
                allowed = [
                    i for i, t in self.texts.items() if i < scores.shape[1] and _continues(partial + t, text)
                ]
                if not allowed:  # nothing in the vocabulary continues it: its rest is written for it
                    row.segments[row.index] = ("force", text, 0)
                    row.forced = list(self._tag_ids(text[len(partial) :]))
                    allowed = row.forced[:1]
                keep = scores[r, allowed].clone()
                scores[r, :] = float("-inf")
                scores[r, allowed] = torch.where(torch.isfinite(keep), keep, torch.zeros_like(keep))
                continue
            if written.strip():
                banned = [i for i, t in self.no_open_tag.items() if not self._may_close(written, t, text)]
            else:  # no word yet: the tag may not close, and one blank token is the most it may begin with
                banned = [*self.no_open_tag, *self.pieces, *(self.blank if row.free_ids else [])]
            banned += list(self.ends)
            scores[r, [i for i in banned if i < scores.shape[1]]] = float("-inf")
            scores[r, self.vocab_end :] = float("-inf")
        return scores

    @staticmethod
    def _may_close(written: str, token_text: str, close: str) -> bool:
        """Whether `token_text` (which holds "<") could be the start of `close` after `written`."""
        at = token_text.find("<")
        return close.startswith(token_text[at:]) or (written + token_text[:at]).endswith(close)
