"""The chunker never cuts inside speech markup (issue #51), however the text is split into
deltas; an SSML reply's chunks are each a document of their own (`markup.SsmlFrames`), which
together say what the whole says."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.reply.chunker import ChunkerConfig, HeldText, IncrementalSentenceChunker
from kokoro_contract import markup

INLINE = (
    "Sure, I can help with that [pause:1.5s] right away for you. Your order "
    "[ORD](/ˈɔɹdəɹ/) ships today, and it is insured. [pause:500ms] Is there anything else "
    "I can do for you, [Kokoro](/kˈOkəɹO/) fans? Thanks a lot for calling us today."
)
SSML = (
    '<speak>Sure, I can help with that. <break time="1s"/> Your order number '
    '<say-as interpret-as="characters">ORD</say-as> ships today, &amp; it is insured. '
    '<prosody rate="slow">Is there anything else I can do for you, my friend? Thanks.'
    '</prosody> Goodbye, and <sub alias="see you">cya</sub> soon.</speak>'
)
CONFIG = ChunkerConfig(merge_below_chars=20, soft_max_chars=40, max_chars=60)


def _chunks(deltas: list[str]) -> list[str]:
    chunker = IncrementalSentenceChunker(CONFIG)
    out = [chunk for delta in deltas for chunk in chunker.push(delta)]
    return out + chunker.flush()


@pytest.mark.parametrize("text", [INLINE, SSML], ids=["inline", "ssml"])
def test_chunks_never_cut_markup_however_the_text_arrives(text: str) -> None:
    whole = _chunks([text])
    assert len(whole) >= 4
    ssml = markup.is_ssml(text)
    for chunk in whole:  # every construct whole in its chunk
        _, held = markup.protected(chunk, ssml)
        assert held is None, chunk
        assert chunk.count("[") == chunk.count("]")
        assert chunk.count("<") == chunk.count(">")
    assert " ".join(whole).split() == text.split()
    for k in range(1, len(text)):
        assert _chunks([text[:k], text[k:]]) == whole, k
    assert _chunks(list(text)) == whole


def test_an_ssml_replys_chunks_are_documents_that_say_the_whole() -> None:
    frames = markup.SsmlFrames()
    framed = [frames.frame(chunk) for chunk in _chunks([SSML])]
    items = [item for chunk in framed for item in markup.parse(chunk, "strict")]
    assert (
        markup.spoken_text(tuple(items)).split()
        == markup.spoken_text(markup.parse(SSML, "strict")).split()
    )
    pauses = [item for item in items if isinstance(item, markup.Pause)]
    assert pauses == [markup.Pause(1.0)]
    slow = " ".join(
        item.text for item in items if isinstance(item, markup.Words) and item.rate == 0.8
    )
    assert "anything else" in slow
    assert "Thanks." in slow
    assert "Goodbye" not in slow  # after </prosody>, in the same chunk


def test_unfinished_markup_is_held_only_so_long() -> None:
    chunker = IncrementalSentenceChunker(CONFIG)
    assert chunker.push("Hello there, my good friend. Wait [pause:") == [
        "Hello there, my good friend."
    ]
    assert chunker.push("1s] now. And the next one is here. ") == ["Wait [pause:1s] now."]
    # a bracket that never closes is text once HOLD_CHARS have come after it
    chunker = IncrementalSentenceChunker(CONFIG)
    text = "Look [" + "and see the words go on " * 20
    assert len(text) > markup.HOLD_CHARS
    assert chunker.push(text)  # cut, as text


def test_a_clients_held_text_is_split_outside_markup() -> None:
    held = HeldText(max_chars=30)
    held.push("Please say [Kokoro](/kˈOkəɹO/) and then [pause:2s] wait a while, please.")
    pieces = held.flush()
    assert all(markup.protected(piece, False)[1] is None for piece in pieces)
    assert "[Kokoro](/kˈOkəɹO/)" in " ".join(pieces)


FRAGMENTS = st.sampled_from(
    [
        "Sure thing, my friend.",
        " ",
        "Your order ships today",
        ", ",
        ". ",
        "[pause:1.5s]",
        "[Kokoro](/kˈOkəɹO/)",
        "[docs](/docs/)",
        "[1]",
        "<break time='1s'/>",
        "<sub alias='sequel'>SQL</sub>",
        "&amp;",
        "and then we will see about it",
        "? ",
    ]
)


@settings(max_examples=150, deadline=None)
@given(st.booleans(), st.lists(FRAGMENTS, min_size=1, max_size=25), st.data())
def test_any_mix_is_cut_alike_however_it_arrives_and_never_inside_a_construct(
    ssml: bool, fragments: list[str], data: st.DataObject
) -> None:
    text = ("<speak>" if ssml else "") + "".join(fragments) + ("</speak>" if ssml else "")
    whole = _chunks([text])
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(text) - 1)), max_size=6)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    assert _chunks(pieces) == whole
    spans, _ = markup.protected(text, ssml)
    for start, end in spans:  # every construct whole in one chunk
        assert any(text[start:end] in chunk for chunk in whole), text[start:end]
