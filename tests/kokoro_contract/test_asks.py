"""`kokoro_contract.asks`: the unit admission counts, one reply's asked-for synthesis."""

from __future__ import annotations

from kokoro_contract.asks import Ask


def test_an_ask_is_starting_until_it_has_chunks_to_weigh() -> None:
    starting = Ask()
    assert (starting.starting, starting.chunks) == (True, None)
    done = Ask.under_way()  # all synthesized: it counts, with nothing left to delay
    assert (done.starting, done.chunks) == (False, ())
    chunks = Ask.under_way(iter([(0.8, 0.4), (2.0, 2.4)]))  # any iterable, kept as a tuple
    assert (chunks.starting, chunks.chunks) == (False, ((0.8, 0.4), (2.0, 2.4)))
    # a value: equal when what is asked is equal, usable as a key
    assert {Ask(), Ask(), done, Ask.under_way([])} == {Ask(), done}
