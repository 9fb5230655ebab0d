"""Speech markup's parser (kokoro_contract/markup.py), pure: inline pronunciations and pauses,
the SSML subset, the three modes, and what the chunker needs (protected spans, SSML framing)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kokoro_contract import markup
from kokoro_contract.errors import InvalidRequest
from kokoro_contract.markup import Pause, Said, Words, parse

SYMBOLS = frozenset("abcdefghijklmnopqrstuvwxyzAIOWYˈˌəɹɔæɪʊʌθðŋʃʒː ")


def test_a_plain_text_is_one_run_of_words() -> None:
    assert parse("Hello there. How are you?") == (Words("Hello there. How are you?"),)
    assert parse("   ") == ()


def test_inline_pronunciations_and_pauses() -> None:
    items = parse("Say [Kokoro](/kˈOkəɹO/) now [pause:1.5s] and [PAUSE: 250ms] done.", "strict")
    assert items == (
        Words("Say "),
        Said("Kokoro", ipa="kˈOkəɹO"),
        Words(" now "),
        Pause(1.5),
        Words(" and "),
        Pause(0.25),
        Words(" done."),
    )


def test_under_auto_a_markdown_link_is_read_as_its_text() -> None:
    # plain ASCII letters: a path, not IPA (a link's text is what a person reads)
    assert parse("See [docs](/docs/) today.") == (Words("See docs today."),)
    # IPA the model cannot say, under auto: read as its text too
    assert parse("[Zed](/zʘd/)", symbols=SYMBOLS) == (Words("Zed"),)
    # a link to elsewhere and brackets that are not markup stay text
    assert parse("[1] see [here](https://x.y) [pause:soon]") == (
        Words("[1] see [here](https://x.y) [pause:soon]"),
    )


@pytest.mark.parametrize(
    ("text", "code", "named"),
    [
        ("[Zed](/zʘd/)", "invalid_ipa", "U+0298"),
        ("[Zed](//)", "invalid_ipa", "empty"),
        ("Say [Zed](/zˈɛd", "invalid_markup", "'/)'"),
        ("Wait [pause:soon] please", "invalid_markup", "character 5"),
        ("Wait [pause:2", "invalid_markup", "character 5"),
    ],
)
def test_strict_names_what_does_not_parse(text: str, code: str, named: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(text, "strict", SYMBOLS)
    assert caught.value.code == code
    assert named in caught.value.message
    parse(text, "auto", SYMBOLS)  # never an error under auto
    assert parse(text, "none", SYMBOLS) == (Words(text),)


@pytest.mark.parametrize("mode", ["auto", "strict"])
def test_a_pause_over_the_limit_is_refused_in_any_mode_that_reads_markup(mode: str) -> None:
    for text in ("[pause:600s]", '<speak><break time="10001ms"/></speak>'):
        with pytest.raises(InvalidRequest) as caught:
            parse(text, mode)
        assert caught.value.code == "pause_too_long"
    assert parse("[pause:10s]", mode) == (Pause(10.0),)


def test_a_texts_pauses_together_are_bounded_too() -> None:
    assert len(parse("a [pause:10s] " * 6)) == 12
    with pytest.raises(InvalidRequest) as caught:
        parse("a [pause:10s] " * 7)
    assert caught.value.code == "pause_too_long"
    assert "70 s in all" in caught.value.message


def test_the_pause_limit_is_the_callers() -> None:
    with pytest.raises(InvalidRequest):
        parse("[pause:3s]", max_pause_s=2.5)
    assert parse("[pause:600s]", "none") == (Words("[pause:600s]"),)


def test_the_ssml_subset() -> None:
    text = (
        '<speak>Hi <break time="500ms"/><break strength="strong"/><break/>'
        '<prosody rate="slow">slow <sub alias="sequel">SQL</sub>'
        '<prosody rate="50%">slower</prosody></prosody> '
        '<say-as interpret-as="characters">ABC</say-as> '
        '<phoneme alphabet="ipa" ph="kˈOkəɹO">Kokoro</phoneme><p>Para</p><s>graph</s>'
        "&amp; more.</speak>"
    )
    assert parse(text, "strict", SYMBOLS) == (
        Words("Hi "),
        Pause(0.5),
        Pause(0.75),
        Pause(0.5),
        Words("slow ", 0.8),
        Said("SQL", alias="sequel", rate=0.8),
        Words("slower", 0.4),
        Words(" "),  # white space between constructs stays: their words are apart
        Said("ABC", say_as="characters"),
        Words(" "),
        Said("Kokoro", ipa="kˈOkəɹO"),
        Words("Para graph & more."),
    )


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("<speak>Hello", "no element found"),
        ("<speak><audio src='x'/>Hi</speak>", "<audio> is not supported"),
        ('<speak><break time="soon"/></speak>', "time='soon'"),
        ('<speak><break strength="loud"/></speak>', "strength='loud'"),
        ('<speak><prosody rate="warp">x</prosody></speak>', "rate='warp'"),
        ('<speak><phoneme alphabet="x-sampa" ph="k">k</phoneme></speak>', 'alphabet="ipa"'),
        ("<speak><sub>SQL</sub></speak>", "needs an alias"),
        ('<speak><say-as interpret-as="vulgar">x</say-as></speak>', "interpret-as='vulgar'"),
        ("<speak><sub alias='a'><break/></sub></speak>", "<break> inside <sub>"),
    ],
)
def test_strict_ssml_names_the_place(text: str, named: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse(text, "strict", SYMBOLS)
    assert caught.value.code == "invalid_markup"
    assert named in caught.value.message
    assert "line 1, column" in caught.value.message
    # under auto, what could not be taken is read as text: no tag is ever said
    for item in parse(text, "auto", SYMBOLS):
        assert "<" not in getattr(item, "text", "")
        assert "<" not in getattr(item, "written", "")


def test_ssml_has_no_entities_but_xmls_own() -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse("<speak>&a;</speak>", "strict")
    assert caught.value.code == "invalid_markup"
    assert "undefined entity" in caught.value.message
    # a document type can only come before the root: such a text is not SSML (no entity in it
    # is ever expanded), its words are read as text
    bomb = '<!DOCTYPE speak [<!ENTITY a "aaaaaaaaaa">]><speak>&a;&a;</speak>'
    assert parse(bomb, "strict") == (Words(bomb),)


def test_unknown_ipa_in_an_ssml_phoneme() -> None:
    text = '<speak><phoneme alphabet="ipa" ph="zʘd">Zed</phoneme></speak>'
    with pytest.raises(InvalidRequest) as caught:
        parse(text, "strict", SYMBOLS)
    assert caught.value.code == "invalid_ipa"
    assert parse(text, "auto", SYMBOLS) == (Words("Zed"),)


def test_check_markup() -> None:
    assert markup.check_markup(None) == "auto"
    assert markup.check_markup("none") == "none"
    with pytest.raises(InvalidRequest) as caught:
        markup.check_markup("html")
    assert caught.value.code == "invalid_field"


# --- what the chunker needs ----------------------------------------------------------------


def test_protected_spans_and_what_is_held() -> None:
    text = "Hi [pause:1.5s] there [Kokoro](/kˈOkəɹO/) and [Ko"
    spans, held = markup.protected(text, ssml=False)
    assert [text[a:b] for a, b in spans] == ["[pause:1.5s]", "[Kokoro](/kˈOkəɹO/)"]
    assert held == text.rindex("[Ko")
    for partial in ("[pause:1", "[Kokoro]", "[Kokoro](", "[Kokoro](/kˈO"):
        assert markup.protected("Hi " + partial, ssml=False)[1] == 3
    assert markup.protected("Hi [1] and [x](http://y)", ssml=False) == ([], None)
    # held for HOLD_CHARS at most: then it is text
    long = "Hi [" + "x" * markup.HOLD_CHARS
    assert markup.protected(long, ssml=False)[1] is None


def test_protected_ssml() -> None:
    text = '<speak>Hi <break time="1s"/> a <sub alias="x > y">SQL</sub> &amp; <say-as in'
    spans, held = markup.protected(text, ssml=True)
    assert [text[a:b] for a, b in spans] == [
        "<speak>",
        '<break time="1s"/>',
        '<sub alias="x > y">SQL</sub>',
        "&amp;",
    ]
    assert held == text.index("<say-as")
    assert markup.protected("<speak>a <sub alias='b'>c", ssml=True)[1] == 9
    assert markup.protected("<speak>a &am", ssml=True)[1] == 9


def test_ssml_frames_make_each_chunk_a_document() -> None:
    frames = markup.SsmlFrames()
    chunks = ['<speak>One <prosody rate="slow">two.', "three.</prosody> four.", "five.</speak>"]
    framed = [frames.frame(chunk) for chunk in chunks]
    assert framed == [
        '<speak>One <prosody rate="slow">two.</prosody></speak>',
        '<speak><prosody rate="slow">three.</prosody> four.</speak>',
        "<speak>five.</speak>",
    ]
    items = [item for chunk in framed for item in parse(chunk, "strict")]
    assert items == [
        Words("One "),
        Words("two.", 0.8),
        Words("three.", 0.8),
        Words(" four."),
        Words("five."),
    ]


# --- whatever comes ------------------------------------------------------------------------

PIECES = st.sampled_from(
    [
        "Hello",
        " ",
        ".",
        "[",
        "]",
        "(",
        ")",
        "/",
        "pause:",
        "1.5s",
        "500ms",
        "kˈO",
        "<speak>",
        "</speak>",
        "<break time='1s'/>",
        "<prosody rate='slow'>",
        "</prosody>",
        "<sub alias='x'>",
        "</sub>",
        "&amp;",
        "&",
        "<",
        ">",
        "ʘ",
    ]
)
TEXTS = st.lists(PIECES, max_size=30).map("".join) | st.text(max_size=60)


def _read(text: str, mode: str) -> tuple[markup.Item, ...] | InvalidRequest:
    try:
        return parse(text, mode, SYMBOLS)
    except InvalidRequest as exc:
        return exc


@settings(max_examples=300, deadline=None)
@given(TEXTS)
def test_auto_never_fails_on_what_an_llm_might_write(text: str) -> None:
    items = _read(text, "auto")
    if isinstance(items, InvalidRequest):
        assert items.code == "pause_too_long"
        return
    for item in items:
        assert isinstance(item, Words | Said | Pause)
        if isinstance(item, Pause):
            assert 0 <= item.seconds <= markup.DEFAULT_MAX_PAUSE_S


@settings(max_examples=300, deadline=None)
@given(TEXTS)
def test_strict_fails_only_with_a_named_code(text: str) -> None:
    refused = _read(text, "strict")
    if isinstance(refused, InvalidRequest):
        assert refused.code in {"invalid_markup", "invalid_ipa", "pause_too_long"}
        assert refused.message


@settings(max_examples=200, deadline=None)
@given(TEXTS)
def test_protected_spans_are_whole_and_in_the_text(text: str) -> None:
    for ssml in (False, True):
        spans, held = markup.protected(text, ssml)
        assert all(0 <= start < end <= len(text) for start, end in spans)
        assert held is None or 0 <= held < len(text)
