"""Pronunciation lexicons (kokoro_contract/lexicon.py), pure: their checks and limits, the case
rule, whole words and the longest key first, and what a chunk of text uses."""

from __future__ import annotations

import pytest

from kokoro_contract import lexicon, markup
from kokoro_contract.errors import InvalidRequest
from kokoro_contract.lexicon import Lexicon, apply, check_entries
from kokoro_contract.markup import Said, Words

ENTRIES = {
    "kokoro": "/kˈOkəɹO/",
    "SQL": "sequel",
    "New York": "/nu jˈɔɹk/",
    "York": "/jˈɔɹk/",
    "AT&T": "A T and T",
}


def test_the_phonemes_markup_knows_are_the_models() -> None:
    from model_server.engines.weights import load_vocab

    assert frozenset(load_vocab()) == markup.PHONEMES


def test_the_case_rule_whole_words_and_the_longest_key_first() -> None:
    items = apply(
        markup.parse("Kokoro and KOKORO, not kokoros; SQL not sql. New York, York. AT&T!"),
        ENTRIES,
    )
    assert items == (
        Said("Kokoro", ipa="kˈOkəɹO"),
        Words(" and "),
        Said("KOKORO", ipa="kˈOkəɹO"),  # a lower-case key: any case
        Words(", not kokoros; "),  # whole words only
        Said("SQL", alias="sequel"),
        Words(" not sql. "),  # a key with a capital: that spelling only
        Said("New York", ipa="nu jˈɔɹk"),  # the longer key first
        Words(", "),
        Said("York", ipa="jˈɔɹk"),
        Words(". "),
        Said("AT&T", alias="A T and T"),
        Words("!"),
    )


def test_markup_and_rates_are_kept() -> None:
    text = '<speak><prosody rate="slow">Hi SQL</prosody><break time="1s"/></speak>'
    assert apply(markup.parse(text), ENTRIES) == (
        Words("Hi ", 0.8),
        Said("SQL", alias="sequel", rate=0.8),
        markup.Pause(1.0),
    )


def test_what_a_chunk_uses_and_a_merge() -> None:
    deployment = Lexicon("deploy", check_entries(ENTRIES))
    assert deployment.used("Call New York about SQL.") == {
        "New York": "/nu jˈɔɹk/",
        "SQL": "sequel",
    }
    assert deployment.used("Nothing here.") == {}
    mine = Lexicon("mine", {"SQL": "/ˈɛs kjˈu ˈɛl/"}, 3)
    merged = deployment.merged(mine)
    assert merged.entries["SQL"] == "/ˈɛs kjˈu ˈɛl/"
    assert merged.version == 3
    assert deployment.merged(None) is deployment


@pytest.mark.parametrize(
    ("entries", "code", "named"),
    [
        (["kokoro"], "invalid_lexicon", "JSON object"),
        ({"": "x"}, "invalid_lexicon", "''"),
        ({"a<b": "x"}, "invalid_lexicon", "'a<b'"),
        ({"x" * 65: "y"}, "invalid_lexicon", "64"),
        ({"word": ""}, "invalid_lexicon", "'word'"),
        ({"word": 3}, "invalid_lexicon", "'word'"),
        ({"word": "/wˈɜʘd/"}, "invalid_ipa", "U+0298"),
        ({"word": "//"}, "invalid_ipa", "empty"),
        ({f"w{i}": "x" for i in range(100_000)}, "lexicon_too_large", "100000"),
    ],
)
def test_bad_lexicons_are_named(entries: object, code: str, named: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        check_entries(entries)
    assert caught.value.code == code
    assert named in caught.value.message


def test_a_request_carries_at_most_so_many() -> None:
    many = {f"w{i}": "x" for i in range(lexicon.MAX_REQUEST_ENTRIES + 1)}
    with pytest.raises(InvalidRequest):
        check_entries(many, lexicon.MAX_REQUEST_ENTRIES)
    assert len(check_entries(dict(list(many.items())[:10]))) == 10
