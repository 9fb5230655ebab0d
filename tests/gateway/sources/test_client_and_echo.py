from __future__ import annotations

from gateway.sources.client import ClientTextSource
from gateway.sources.echo import EchoSource, tokens


def test_a_token_is_a_word_with_its_trailing_whitespace() -> None:
    assert tokens("Hello there.  How are\nyou?") == ["Hello ", "there.  ", "How ", "are\n", "you?"]
    assert tokens("  lead") == ["  ", "lead"]
    assert "".join(tokens("Keep  every\tspace ")) == "Keep  every\tspace "


async def test_echo_unpaced_is_one_delta_and_paced_is_word_by_word() -> None:
    assert [d async for d in EchoSource("Hello there.").stream()] == ["Hello there."]
    paced = [d async for d in EchoSource("Hello there, friend.", tps=1000).stream()]
    assert paced == ["Hello ", "there, ", "friend."]


async def test_client_text_source_ends_on_flush() -> None:
    source = ClientTextSource()
    assert source.offer("My ")
    assert source.offer("own text.")
    source.end()
    assert [d async for d in source.stream()] == ["My ", "own text."]
