"""When a client's flush is answered (`FlushAcks`), and the plans' side of a flush: `cut`, the
client's own buffering (`client_plan`, `split_text`). Pure."""

from __future__ import annotations

from gateway.reply.chunker import HeldText, split_text
from gateway.reply.flushes import FlushAcks, spoken_chars
from gateway.reply.plan.config import PlanConfig
from gateway.reply.plan.playback_plan import ChunkPlan
from gateway.reply.plan.sentence_plan import SentencePlan, client_plan


def test_a_flush_is_due_once_the_chunk_holding_its_last_character_is_played() -> None:
    acks = FlushAcks()
    acks.text(spoken_chars("Hello there. "))  # 11
    acks.flush("f1")
    acks.text(spoken_chars("How are you?"))  # 10
    acks.flush("f2")
    assert acks.due(100) == []  # nothing sent yet
    acks.sent(spoken_chars("Hello there."))
    assert acks.due(100) == []  # sent, not done
    acks.completed(0, pieces=3)
    assert acks.due(2) == []  # its third piece not given on yet
    assert acks.due(3) == ["f1"]
    assert acks.waiting
    acks.sent(spoken_chars("How are"))  # the plan cut the sentence
    acks.completed(1, pieces=5)
    assert acks.due(9) == []  # f2's last character is in the chunk not sent yet
    acks.sent(spoken_chars("you?"))
    acks.completed(2, pieces=7)
    assert acks.due(6) == []
    assert acks.due(7) == ["f2"]
    assert not acks.waiting


def test_flushes_covering_nothing_new_follow_the_one_before_and_keep_their_order() -> None:
    acks = FlushAcks()
    acks.flush("before any text")
    assert acks.due(0) == ["before any text"]
    acks.text(5)
    acks.flush(1)
    acks.flush(2)  # nothing since the last: due with it
    acks.flush(None)  # no id: due, said by nobody
    acks.sent(5)
    assert acks.due(10) == []
    acks.completed(0, pieces=4)
    assert acks.due(4) == [1, 2, None]


def test_flushes_left_at_the_end_are_all_answered() -> None:
    acks = FlushAcks()
    acks.text(5)
    acks.flush("a")
    acks.flush("b")
    assert acks.rest() == ["a", "b"]
    assert acks.rest() == []
    assert not acks.waiting


def test_split_text_cuts_long_text_at_the_best_boundary_that_fits() -> None:
    text = "Hello there. How are you doing today, my friend? Fine."
    assert split_text(text, 100) == [text]
    assert split_text(text, 30) == ["Hello there.", "How are you doing today,", "my friend? Fine."]
    assert split_text("one two three four", 9) == ["one two", "three", "four"]
    assert split_text("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]
    assert split_text("   \n ", 10) == []


def test_held_text_goes_only_at_a_flush_whole() -> None:
    held = HeldText(max_chars=400)
    assert held.push("Sure, I can help you ") == []
    assert held.push("with that. And more") == []
    assert held.flush() == ["Sure, I can help you with that. And more"]
    assert held.flush() == []


def test_the_clients_plan_sends_what_came_before_each_flush_as_one_chunk() -> None:
    plan = client_plan(max_chars=400)
    assert plan.push("Sure, I can help you with that. ", 0.0) == []
    assert plan.push("It takes a minute", 0.1) == []
    (chunk,) = plan.cut(0.2)
    assert (chunk.text, chunk.deadline_ms) == (
        "Sure, I can help you with that. It takes a minute",
        None,
    )
    assert plan.push(" or two.", 0.3) == []
    assert [c.text for c in plan.flush(0.4)] == ["or two."]
    assert plan.playback is None


def test_a_cut_makes_the_last_words_final_and_the_plans_go_on() -> None:
    sentences = SentencePlan()
    sentences.push("Hello there. Half a sen", 0.0)
    assert [c.text for c in sentences.cut(0.1)] == ["Half a sen"]
    sentences.push("tence follows.", 0.2)
    assert [c.text for c in sentences.flush(0.3)] == ["tence follows."]

    plan = ChunkPlan(PlanConfig())
    first = plan.push("One two three", 0.0)  # too few words for a first chunk
    assert first == []
    (chunk,) = plan.cut(0.1)
    assert chunk.text == "One two three"
    wake = plan.wake_at()
    assert wake is None or wake > 0.1  # not ended: more may come
    assert plan.asking
