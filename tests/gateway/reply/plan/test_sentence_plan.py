"""The `sentences` plan (`gateway.reply.plan.sentence_plan`): one chunk per sentence as the
chunker has it, no deadlines, no more than `UNFINISHED_MAX` unfinished, playback never held."""

from __future__ import annotations

from gateway.reply.plan.protocol import UNFINISHED_MAX, Plan
from gateway.reply.plan.sentence_plan import SentencePlan

ANSWER = (
    "Sure, I can help you with that right away. Your order shipped yesterday from our "
    "warehouse in Portland. It should arrive by Thursday afternoon. You will get a tracking "
    "link by email within the hour. Is there anything else I can do for you today?"
)


def test_the_sentences_plan_keeps_no_more_unfinished_either() -> None:
    plan = SentencePlan()
    sent = [c.text for c in plan.push(ANSWER + " " + ANSWER, 0.0)]
    assert len(sent) == UNFINISHED_MAX
    assert plan.wake_at() is None
    assert plan.unsent  # the rest waits for a report
    assert plan.flush(0.1) == []
    plan.completed(0, audio_s=1.0, now=0.5)
    sent += [c.text for c in plan.tick(0.5)]
    assert len(sent) == UNFINISHED_MAX + 1
    plan.completed(0, audio_s=1.0, now=0.6)  # reported again (a resumed stream): no effect
    assert plan.tick(0.6) == []
    index = 1
    while plan.unsent:
        plan.completed(index, audio_s=1.0, now=0.7)
        sent += [c.text for c in plan.tick(0.7)]
        index += 1
    assert " ".join(sent) == ANSWER + " " + ANSWER


def test_the_sentences_plan_sends_each_sentence_at_once_with_no_deadline() -> None:
    plan: Plan = SentencePlan()
    chunks = plan.push("Hello there. How are", 0.0)
    assert [(c.text, c.deadline_ms) for c in chunks] == [("Hello there.", None)]
    assert plan.asking  # one at the engine, unfinished
    assert [(c.text, c.deadline_ms) for c in plan.flush(0.1)] == [("How are", None)]
    plan.completed(0, audio_s=1.0, now=0.5)
    plan.completed(1, audio_s=0.5, now=0.7)
    assert not plan.asking
    assert not plan.unsent


def test_the_sentences_plan_holds_no_playback() -> None:
    """No deadlines, so no hold and no spare time to tell admission: the reply plays its first
    audio as soon as it is ready, and admission tracks no plan for it."""
    plan: Plan = SentencePlan()
    plan.push("Hello there. ", 0.0)
    assert plan.playback is None
    assert plan.wake_at() is None
