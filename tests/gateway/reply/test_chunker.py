from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.reply.chunker import ChunkerConfig, IncrementalSentenceChunker


def one_shot(text: str, config: ChunkerConfig | None = None) -> list[str]:
    chunker = IncrementalSentenceChunker(config)
    return chunker.push(text) + chunker.flush()


def streamed(pieces: list[str], config: ChunkerConfig | None = None) -> list[str]:
    chunker = IncrementalSentenceChunker(config)
    out: list[str] = []
    for piece in pieces:
        out += chunker.push(piece)
    return out + chunker.flush()


def split_every(text: str, n: int) -> list[str]:
    return [text[i : i + n] for i in range(0, len(text), n)]


LATER = "This sentence is long enough to stand on its own as a chunk."


@pytest.mark.parametrize(
    ("text", "chunks"),
    [
        # the reference's three sentences: first released at once, the short ones merge
        (
            "Hello there. This is a post deployment check. It has three sentences.",
            ["Hello there.", "This is a post deployment check. It has three sentences."],
        ),
        (f"Hi! {LATER} {LATER}", ["Hi!", LATER, LATER]),
        (f"Dr. Smith arrived. {LATER}", ["Dr. Smith arrived.", LATER]),
        (f"Mr. and Mrs. Lee came. {LATER}", ["Mr. and Mrs. Lee came.", LATER]),
        (f"Fruit, e.g. apples. {LATER}", ["Fruit, e.g. apples.", LATER]),
        ("We use i.e. notation here. Next.", ["We use i.e. notation here.", "Next."]),
        ("The U.S. Army is big. Next one.", ["The U.S. Army is big.", "Next one."]),
        ("J. R. R. Tolkien wrote it. Next.", ["J. R. R. Tolkien wrote it.", "Next."]),
        ("Pi is 3.14 exactly. Next.", ["Pi is 3.14 exactly.", "Next."]),
        ("It costs $29.99 today. Next.", ["It costs $29.99 today.", "Next."]),
        ("Meet at 10:30 sharp. Next.", ["Meet at 10:30 sharp.", "Next."]),
        ("Install version 2.4.1 now. Next.", ["Install version 2.4.1 now.", "Next."]),
        ("See example.com/a.html today. Next.", ["See example.com/a.html today.", "Next."]),
        ("Mail bob@mail.example.org now. Next.", ["Mail bob@mail.example.org now.", "Next."]),
        ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
        ("Is it (really?) Yes.", ["Is it (really?)", "Yes."]),
        ('"Really?" she asked. Next.', ['"Really?" she asked.', "Next."]),
        ("It costs approx. five dollars. Next.", ["It costs approx. five dollars.", "Next."]),
        ("Wait… What happened? Next.", ["Wait…", "What happened? Next."]),
        ("Line one\nLine two", ["Line one", "Line two"]),
        ("No. 5 is here. Next.", ["No. 5 is here.", "Next."]),
        # first clause released early, once it has a few words
        (
            "Well, I think that the answer, after a lot of thought, is yes.",
            ["Well, I think that the answer,", "after a lot of thought, is yes."],
        ),
        (
            "Here is the plan: we start early and finish late.",
            ["Here is the plan:", "we start early and finish late."],
        ),
        (
            "The short answer here — as always — depends on you.",
            ["The short answer here —", "as always — depends on you."],
        ),
        ("There are 3,000 people, more or less.", ["There are 3,000 people,", "more or less."]),
        # no punctuation at all: the first chunk is forced after 8 words
        (
            "one two three four five six seven eight nine ten eleven",
            ["one two three four five six seven eight", "nine ten eleven"],
        ),
    ],
)
def test_tricky_sentences(text: str, chunks: list[str]) -> None:
    assert one_shot(text) == chunks
    for n in (1, 2, 4):
        assert streamed(split_every(text, n)) == chunks


JA_LATER = "ご注文の品は昨日、ポートランドの倉庫から発送されました。"  # 28 characters: 70


@pytest.mark.parametrize(
    ("text", "chunks"),
    [
        # sentences end at 。！？ with no space after them; a short later one waits
        (
            f"こんにちは。{JA_LATER}はい。{JA_LATER}",
            ["こんにちは。", JA_LATER, f"はい。{JA_LATER}"],
        ),
        # closing brackets stay with their sentence
        (f"「本当ですか？」{JA_LATER}", ["「本当ですか？」", JA_LATER]),
        # the first chunk at a clause mark once it has four words' worth (eight characters)
        (
            "今日はとても良い天気ですね、散歩に行きましょう。",
            ["今日はとても良い天気ですね、", "散歩に行きましょう。"],
        ),
        # but not before: too short a first clause waits for the sentence's end
        ("はい、わかりました。", ["はい、わかりました。"]),
        # Chinese and the full-width forms too
        (f"你好！{JA_LATER}", ["你好！", JA_LATER]),
        # English in between keeps its own rules
        (f"Hello there. {JA_LATER}", ["Hello there.", JA_LATER]),
    ],
)
def test_japanese_and_chinese_end_at_their_own_marks(text: str, chunks: list[str]) -> None:
    assert one_shot(text) == chunks
    for n in (1, 2, 3):
        assert streamed(split_every(text, n)) == chunks


HI_LATER = "आपका ऑर्डर कल पोर्टलैंड के गोदाम से भेजा गया था।"


def test_hindi_sentences_end_at_the_danda() -> None:
    text = f"नमस्ते। {HI_LATER} धन्यवाद॥ {HI_LATER}"
    chunks = ["नमस्ते।", HI_LATER, f"धन्यवाद॥ {HI_LATER}"]  # a short later one waits
    assert one_shot(text) == chunks
    for n in (1, 2, 3):
        assert streamed(split_every(text, n)) == chunks


def test_cjk_text_is_as_long_as_its_speech() -> None:
    from gateway.reply.chunker import spoken_len

    assert spoken_len("Hi。") == 4.5
    assert spoken_len("東京、ｶﾀ") == 12.5  # half-width katakana and its comma are CJK too
    assert spoken_len("a b") == 3


def test_a_long_cjk_later_sentence_breaks_at_a_clause_past_the_soft_cap() -> None:
    clause = "あいうえおかきくけこ" * 6 + "、"  # 61 characters: 152.5 of speech
    text = f"はい。{clause}{clause}{clause}{clause}終わり。"
    chunks = one_shot(text, ChunkerConfig(soft_max_chars=200, max_chars=300))
    assert chunks == ["はい。", clause * 2, clause * 2, "終わり。"]


def test_later_chunks_are_capped() -> None:
    words = " ".join(["word"] * 400)
    text = "Start here. Then " + words + "."
    chunks = one_shot(text)
    assert chunks[0] == "Start here."
    assert len(chunks) == 8
    assert all(len(c) <= 300 for c in chunks)
    assert " ".join(chunks).split() == text.split()


def test_long_later_sentence_breaks_at_a_clause_past_the_soft_cap() -> None:
    clause = "and this goes on " * 12  # 204 characters
    chunks = one_shot(f"First one. A{clause.strip()}, then more words follow here. End.")
    assert chunks[0] == "First one."
    assert chunks[1].endswith(",")
    assert len(chunks[1]) <= 300


def test_nothing_is_released_before_the_boundary_is_certain() -> None:
    chunker = IncrementalSentenceChunker()
    assert chunker.push("Hello there.") == []  # maybe "Hello there.com"? wait
    assert chunker.push(" ") == []  # maybe "Hello there. and ..."? wait
    assert chunker.push("T") == ["Hello there."]
    assert chunker.flush() == ["T"]
    assert chunker.flush() == []


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="first_min_words"):
        ChunkerConfig(first_min_words=5, first_max_words=3)


_tokens = st.sampled_from(
    [
        "Hello",
        "there",
        "Dr.",
        "Smith",
        "e.g.",
        "3.14",
        "$29.99",
        "10:30",
        "U.S.",
        "J.",
        "example.com",
        "a",
        "word",
        "it",
        "Yes",
        ",",
        ".",
        "!",
        "?",
        "…",
        ";",
        ":",
        "—",
        "-",
        '"',
        "(",
        ")",
        " ",
        " ",
        " ",
        "\n",
        "one",
        "two",
        "Three",
        "。",
        "、",
        "！",
        "」",
        "こんにちは",
        "東京",
    ]
)
_texts = st.lists(_tokens, max_size=80).map("".join)


@settings(max_examples=300, deadline=None)
@given(_texts, st.data())
def test_streamed_equals_one_shot_for_any_split(text: str, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(0, len(text)), max_size=20)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    expected = one_shot(text)
    assert streamed(pieces) == expected
    assert "".join("".join(expected).split()) == "".join(text.split())
    assert all(chunk == chunk.strip() and chunk for chunk in expected)


@settings(max_examples=100, deadline=None)
@given(_texts)
def test_one_two_four_characters_at_a_time(text: str) -> None:
    expected = one_shot(text)
    for n in (1, 2, 4):
        assert streamed(split_every(text, n)) == expected
