"""The hops task (prompt_r1.tasks.hops, prompt_r1.tasks.hops_training): a chain of 1 to 3 dependent calls that
only the environment can answer, its fine-tuning data that teaches skills but no chain, and the chain figures.
GRPO learning on it is in tests/test_hops_learning.py."""

from __future__ import annotations

from collections import Counter

from prompt_r1.runs.episode import Episode
from prompt_r1.tasks.hops import (
    ASKED,
    CODES,
    DOORS,
    KEYS,
    KIND,
    NAME_SOME,
    ROOMS,
    HopsTable,
    Table,
    ask_about,
    chain_of,
    hops_environment,
    hops_of,
    hops_rows,
    named,
    pointed,
    question_for,
    render,
    reply_code,
)
from prompt_r1.tasks.hops_agent import mixture_episodes, reading_episodes
from prompt_r1.tasks.hops_training import first_turn_masked, hops_figures


def ask(respond, text, *, earlier=()):
    messages = [
        m
        for prompt, reply in earlier
        for m in ({"role": "user", "content": prompt}, {"role": "assistant", "content": reply})
    ]
    return respond(
        {"messages": [{"role": "system", "content": "s"}, *messages, {"role": "user", "content": text}]}
    )


def test_a_question_names_one_thing_and_its_kind_says_how_many_calls_it_needs():
    for name in KIND:
        assert named(question_for(name)) == [name]
    assert [hops_of(n) for n in ("fox", "jade", "brass")] == [1, 2, 3]
    rows = hops_rows(300, seed=4)
    assert Counter(r["hops"] for r in rows) == {1: 100, 2: 100, 3: 100}  # the three mixed evenly
    table = Table(9)
    for name in KIND:
        assert len(chain_of(table, name)) == hops_of(name)
        assert table.answer(name) in CODES


def test_the_environment_answers_one_named_thing_from_the_current_table():
    table = HopsTable(seed=2)
    respond = hops_environment(table)
    t = table.draw(5)
    key = "brass"
    door = t.opens[key]
    assert ask(respond, ask_about(key)) == f"The brass key opens the {door} door."
    room = t.leads[door]
    assert ask(respond, ask_about(door)) == f"The {door} door leads to the {room} room."
    assert ask(respond, ask_about(room)) == f"The {room} room code is {t.codes[room]}."
    assert ask(respond, "Tell me the code.") == "Name a key, a door or a room."
    assert ask(respond, "The fox room or the owl room?") == "Name one thing."
    assert ask(respond, "Foxes are not a fox.") == f"The fox room code is {t.codes['fox']}."  # whole words
    # Each thing is told once an episode: asking again gets no news (nor a second chance after a lie).
    earlier = [(ask_about(room), "..."), ("Tell me the code.", NAME_SOME)]
    assert ask(respond, ask_about(room), earlier=earlier) == ASKED
    assert ask(respond, ask_about("owl"), earlier=earlier) == f"The owl room code is {t.codes['owl']}."


def test_every_table_is_redrawn_each_step_so_nothing_can_be_learned_by_heart():
    tables = [HopsTable(seed=5).draw(step) for step in range(40)]
    assert tables[3].codes == HopsTable(seed=5).draw(3).codes  # a function of seed and step
    for key in KEYS:
        assert len({t.opens[key] for t in tables}) > 5
    for door in DOORS:
        assert len({t.leads[door] for t in tables}) > 5
    for room in ROOMS:
        assert len({t.codes[room] for t in tables}) > 3
    table = HopsTable(seed=5)
    assert table.group_table(3).codes == HopsTable(seed=5).group_table(3).codes
    assert all(table.group_table(g).opens != table.draw(g).opens for g in range(5))  # no group plays a step's


def test_the_lying_control_lies_on_the_first_call_to_a_chain_that_ends_wrong_and_withheld_hides_codes():
    table = HopsTable(seed=7)
    respond = hops_environment(table)
    t = table.draw(11)
    table.reply = "lying"
    for name in KIND:  # the lie starts a chain that ends on another code than the truth's
        lie = pointed(ask(respond, ask_about(name))) if KIND[name] != "room" else None
        told = reply_code(ask(respond, ask_about(name)))
        assert (t.answer(lie) if lie else told) != t.answer(name)
    later = ask(respond, ask_about("fox"), earlier=[("Tell me the code.", NAME_SOME)])
    assert later == f"The fox room code is {t.codes['fox']}."  # only the first reply lies
    assert ask(respond, ask_about("fox"), earlier=[(ask_about("fox"), "a lie")]) == ASKED  # and is not undone
    table.reply = "withheld"
    assert not any(code in ask(respond, ask_about("fox")) for code in CODES)
    assert (
        ask(respond, ask_about("jade")) == f"The jade door leads to the {t.leads['jade']} room."
    )  # links honest


def test_whole_chain_fine_tuning_holds_no_facts():
    codes_of: dict[str, set] = {}
    for question, script in reading_episodes(1500, seed=3):
        start = named(question)[0]
        calls = script[0:-1:2]
        assert len(calls) == hops_of(start)
        assert named(calls[0]) == [start]
        for call, reply in zip(calls[1:], script[1:-1:2], strict=False):
            assert named(call) == [pointed(reply)]  # each call names what the last reply named
        code = reply_code(script[-2])
        assert script[-1].endswith(f"<answer>{code}</answer>")
        codes_of.setdefault(start, set()).add(code)
    assert all(len(codes) > len(CODES) / 2 for codes in codes_of.values())  # no start has a code to learn


def test_the_mixture_prefers_no_choice_at_any_turn():
    first, after_link, after_code, copied, answered_after_code = Counter(), Counter(), Counter(), [], 0
    for question, script in mixture_episodes(6000, seed=1):
        start = named(question)[0]
        turns, replies = script[0::2], script[1::2]
        for k, turn in enumerate(turns):
            reply = replies[k - 1] if k else None
            if "<answer>" in turn:
                choice = "answer"
                if reply and reply_code(reply):
                    answered_after_code += 1
                    copied.append(f"<answer>{reply_code(reply)}</answer>" in turn)
            elif named(turn) == [start]:
                choice = "question"
            elif reply and named(turn) == [pointed(reply)]:
                choice = "reply"
            else:
                choice = "other"
            if k == 4:
                continue  # the fifth turn always answers (fine-tuning calls at most 4 times)
            if reply is None:
                first[choice] += 1
            elif reply_code(reply):
                after_code[choice] += 1
            elif pointed(reply) is not None:
                after_link[choice] += 1
    for counter in (first, after_link):
        shares = [v / sum(counter.values()) for v in counter.values()]
        assert len(shares) == 3 and max(shares) - min(shares) < 0.05, counter
    # After a code reply, asking about the room again is both "question" (1-hop) and "reply": answer stays a third.
    assert abs(after_code["answer"] / sum(after_code.values()) - 1 / 3) < 0.04
    assert copied and all(copied)  # copying is a skill kept whole: only when to answer is left to GRPO


def _episode(question, calls, answer):
    turns = [{"prompt": p, "response": r, "response_source": "environment"} for p, r in calls]
    return Episode(id=None, question=question, status="answered", answer=answer, turns=turns)


def test_the_chain_figures_count_a_right_answer_only_from_the_last_reply_and_a_call_only_when_it_follows():
    t = Table(3)
    key = "iron"
    door, room = t.opens[key], t.leads[t.opens[key]]
    code = t.codes[room]
    chain = [(ask_about(n), render(n, t.step(n))) for n in (key, door, room)]
    f = hops_figures(_episode(question_for(key), chain, code), t)
    assert (f["hops/hop1"], f["hops/hop2"], f["hops/hop3"]) == (1.0, 1.0, 1.0)
    assert f["hops/from_last_reply"] == f["hops/from_last_reply_3"] == f["hops/exact_calls"] == 1.0
    assert f["hops/from_last_reply_1"] is None and f["hops/calls"] == 3.0
    # An extra call after the code: right, but not from the last reply, and not exactly the calls needed.
    extra = chain + [("Tell me the code.", "Name a key, a door or a room.")]
    f = hops_figures(_episode(question_for(key), extra, code), t)
    assert f["hops/correct"] == 1.0 and f["hops/from_last_reply"] == 0.0 and f["hops/exact_calls"] == 0.0
    # Answered early with the right code: a guess.
    f = hops_figures(_episode(question_for(key), chain[:1], code), t)
    assert f["hops/correct"] == 1.0 and f["hops/from_last_reply"] == 0.0 and f["hops/hop2"] == 0.0
    # Asking the question's thing twice does not follow the chain.
    f = hops_figures(_episode(question_for(key), [chain[0], chain[0]], code), t)
    assert f["hops/hop2"] == 0.0 and f["hops/hop3"] == 0.0
    # A 1-hop question has no second hop.
    f = hops_figures(_episode(question_for(room), chain[2:], code), t)
    assert f["hops/hop2"] is None and f["hops/from_last_reply_1"] == 1.0


def test_masking_the_first_turn_masks_only_the_agents_first_run_of_tokens():
    assert first_turn_masked([0, 0, 1, 1, 1, 0, 0, 1, 1, 0]) == [0, 0, 0, 0, 0, 0, 0, 1, 1, 0]
    assert first_turn_masked([1, 1, 0, 1]) == [0, 0, 0, 1]
    assert first_turn_masked([]) == []


def test_a_row_draw_is_reproducible_and_mixes_starts():
    assert hops_rows(30, seed=1) == hops_rows(30, seed=1)
    starts = [named(r["question"])[0] for r in hops_rows(72, seed=1)]
    assert Counter(KIND[s] for s in starts) == {"room": 24, "door": 24, "key": 24}
    assert len(set(starts)) == 36  # every name in turn


def test_the_mixture_trains_on_copied_codes_but_not_on_guessed_ones(tmp_path):
    """A guess's code is uniform noise: trained on, it taught the sampled agent to answer a random code after a
    code reply too (copy fell to 40-70 % on some seeds). The build leaves it out of the targets, and only it."""
    from transformers import AutoTokenizer

    from prompt_r1.tasks.hops_agent import all_but_copied_code, guessed_code
    from prompt_r1.testing.tiny_models import build_tiny_model, episode_rows

    episodes = mixture_episodes(200, seed=5)
    tags = ["<think>", "</think>", "<answer>", "</answer>", "<interaction_prompt>", "</interaction_prompt>"]
    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path, corpus=list(CODES), added_tokens=tags))
    plain = episode_rows(tok, episodes)
    masked = episode_rows(tok, episodes, untrained=guessed_code)
    guesses = copies = 0
    for (_, script), (ids, labels), (same_ids, kept) in zip(episodes, plain, masked, strict=True):
        assert same_ids == ids  # the stream is unchanged: only what is a target differs
        dropped = tok.decode([t for t, a, b in zip(ids, labels, kept, strict=True) if a != b])
        answer = script[-1]
        guesses += "<think>guess</think>" in answer
        copies += "<think>ok</think>" in answer
        if "<think>guess</think>" in answer:
            assert dropped.strip() == answer.split("<answer>")[1].split("</answer>")[0]
        else:
            assert dropped == "" and kept == labels
    assert guesses > 100 and copies > 10  # both kinds checked (a guess ends 9 in 10 mixture episodes)
    # The rows trained beside the mixture: whole chains of which the copied code alone is a target (and the
    # end-of-turn token after it), so they teach copying and no choice.
    chains = reading_episodes(50, seed=5)
    for (_, script), (_ids, labels) in zip(
        chains, episode_rows(tok, chains, untrained=all_but_copied_code), strict=True
    ):
        targets = [t for t in labels if t != -100]
        assert targets[-1] == tok.eos_token_id
        assert tok.decode(targets[:-1]).strip() == reply_code(script[-2])
