from __future__ import annotations

import re

import pytest
import regex  # type: ignore[import-untyped]  # (misaki needs it: always installed)
from hypothesis import given, settings
from hypothesis import strategies as st

from model_server.text.normalize import _RULES, normalize


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("It costs $29.99.", "It costs twenty-nine dollars and ninety-nine cents."),
        ("Just $5 or $1.50!", "Just five dollars or one dollar and fifty cents!"),
        ("Only $0.99", "Only ninety-nine cents"),
        ("A $2.5 billion deal", "A two point five billion dollars deal"),
        ("£3 and €1", "three pounds and one euro"),
        ("Meet at 3:30 pm.", "Meet at three thirty PM."),
        ("At 10:05 or 9:00.", "At ten oh five or nine o'clock."),
        ("Home by 6:15 p.m. Then sleep.", "Home by six fifteen PM. Then sleep."),
        ("Open 9:00 a.m. to noon", "Open nine AM to noon"),
        ("Up 42% today.", "Up forty-two percent today."),
        ("On the 22nd of May.", "On the twenty-second of May."),
        ("Pi is 3.14.", "Pi is three point one four."),
        ("Version 2.4.1 is out.", "Version two point four point one is out."),
        ("Born in 1999.", "Born in nineteen ninety-nine."),
        ("We had 1,234 users.", "We had one thousand, two hundred and thirty-four users."),
        ("Dr. Smith met Mr. Lee.", "Doctor Smith met Mister Lee."),
        ("Apples, pears, etc.", "Apples, pears, et cetera."),
        ("Fruit, e.g. apples.", "Fruit, for example apples."),
        ("The U.S. team won.", "The U S team won."),
        ("Made in the U.S. Really.", "Made in the U S. Really."),
        ("Plain prose stays.", "Plain prose stays."),
    ],
)
def test_normalize(text: str, spoken: str) -> None:
    assert normalize(text) == spoken


def test_normalize_is_idempotent_on_its_output() -> None:
    once = normalize("Dr. Lee paid $29.99 at 3:30 pm on the 2nd, e.g. 42% off.")
    assert normalize(once) == once


# --- numbers of any length: read in words while people read them so, then digit by digit ------

NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIGITS_400 = "1234567890" * 40


def spelled(digits: str) -> str:
    return " ".join(NAMES[int(d)] for d in digits)


def short(value: object) -> str:
    """A test id that stays readable when the text is 400 digits long."""
    text = str(value)
    return text if len(text) <= 24 else f"{text[:16]}...({len(text)} chars)"


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        # plain runs: words up to 15 digits, then digit by digit
        (
            "123456789012345",
            "one hundred and twenty-three trillion, four hundred and fifty-six billion, seven "
            "hundred and eighty-nine million, twelve thousand, three hundred and forty-five",
        ),
        ("1234567890123456", spelled("1234567890123456")),
        (DIGITS_400, spelled(DIGITS_400)),
        (f"Call {DIGITS_400} now.", f"Call {spelled(DIGITS_400)} now."),
        ("٣" * 20, spelled("3" * 20)),  # any Unicode digits
        # grouped with commas: an amount, in words up to 36 digits
        ("1,000,000,000,000,000,000", "one quintillion"),
        ("1" + ",000" * 12, spelled("1" + "000" * 12)),
        # decimals: the whole part by the same rule, the fraction digit by digit
        (f"{DIGITS_400}.25", f"{spelled(DIGITS_400)} point two five"),
        ("0." + "7" * 400, "zero point " + spelled("7" * 400)),
        ("It is 1,234.5 m.", "It is one thousand, two hundred and thirty-four point five m."),
        # ordinals: the last digit as an ordinal
        (
            "The 1000000000000000000000000000000000000000th guest.",
            "The " + spelled("1" + "0" * 38) + " zeroth guest.",
        ),
        ("The 1,000th guest.", "The one thousandth guest."),
        (
            "The 99999999999999th",
            "The ninety-nine trillion, nine hundred and ninety-nine billion, "
            "nine hundred and ninety-nine million, nine hundred and ninety-nine thousand, "
            "nine hundred and ninety-ninth",
        ),
        # currency
        ("$" + "9" * 400, spelled("9" * 400) + " dollars"),
        ("€" + "9" * 400 + ".01", spelled("9" * 400) + " euros and one cent"),
        ("$" + "9" * 400 + ".5 million", spelled("9" * 400) + " point five million dollars"),
        ("A $2.50 million deal", "A two point five million dollars deal"),
        ("A $1.0 billion deal", "A one billion dollars deal"),
        ("£1,000,000,000,000,000,000", "one quintillion pounds"),
        # percentages, versions, years
        (DIGITS_400 + "%", spelled(DIGITS_400) + " percent"),
        ("Version 1.2." + "3" * 20, "Version one point two point " + spelled("3" * 20)),
        ("In 1984 and 2001.", "In nineteen eighty-four and two thousand and one."),
    ],
    ids=short,
)
def test_numbers_of_any_length(text: str, spoken: str) -> None:
    assert normalize(text) == spoken


def test_more_digits_than_int_reads_is_still_spelled() -> None:
    # int() refuses strings of more than 4,300 digits; --max-text-chars may allow 5,000
    digits = "8" * 5_000
    assert normalize(f"{digits}th") == spelled(digits[:-1]) + " eighth"
    assert normalize(digits) == spelled(digits)


def attempt_reads(pattern: re.Pattern[str], text: str) -> list[int]:
    """For each position of `text`, the characters a match attempt of `pattern` starting there
    must read before it can fail or succeed: the longest piece from there that is still the
    start of some match (found by the `regex` module's partial matching, with the pattern's
    own syntax and flags). Any regex engine trying that position reads at least that much."""
    flags = regex.IGNORECASE if pattern.flags & re.IGNORECASE else 0
    compiled = regex.compile(pattern.pattern, flags)

    def viable(start: int, length: int) -> bool:
        return compiled.fullmatch(text, start, start + length, partial=True) is not None

    reads = []
    for start in range(len(text)):
        rest = len(text) - start
        if not viable(start, 0):
            reads.append(0)
            continue
        good, bad = 0, 1  # viable(good) holds; grow `bad` until it fails, then bisect
        while bad <= rest and viable(start, bad):
            good, bad = bad, 2 * bad
        bad = min(bad, rest + 1)
        while bad - good > 1:
            mid = (good + bad) // 2
            good, bad = (mid, bad) if viable(start, mid) else (good, mid)
        reads.append(good)
    return reads


def test_a_long_digit_run_costs_linear_work() -> None:
    """The percent rule used to try a match at every digit of a run, each attempt reading to
    the run's end: n**2 steps, 4.6 s for 10,000 digits (on the one G2P thread every session
    shares). Counted here, not timed: every rule, over the text as normalize hands it on, reads
    at most about twice the text in all its attempts."""
    digits = "9" * 2_000
    text = digits + " and 5%"
    for pattern, repl in _RULES:
        reads = attempt_reads(pattern, text)
        assert sum(reads) <= 2 * len(text), (pattern.pattern, sum(reads))
        text = pattern.sub(repl, text)
    assert normalize(digits + " and 5%") == spelled(digits) + " and five percent"


def digit_runs(min_size: int, max_size: int) -> st.SearchStrategy[str]:
    """Digit strings of lengths spread evenly (st.text favours short ones)."""
    return st.integers(min_size, max_size).flatmap(
        lambda n: st.text(alphabet="0123456789", min_size=n, max_size=n)
    )


NUMBER_FORMS = ("{n}", "${n}", "£{n}.99", "€{n}.5 million", "{n}th", "{n}%", "{n}.{n}", "1.2.{n}")


@settings(max_examples=150, deadline=None)
@given(
    digits=digit_runs(1, 600),
    form=st.sampled_from(NUMBER_FORMS),
)
def test_every_number_form_reads_as_words(digits: str, form: str) -> None:
    spoken = normalize(f"Say {form.format(n=digits)} now")
    assert spoken.startswith("Say ")
    assert spoken.endswith(" now")
    assert not any(c.isdigit() for c in spoken), spoken


@settings(max_examples=100, deadline=None)
@given(digit_runs(16, 600))
def test_long_digit_runs_are_read_digit_by_digit(digits: str) -> None:
    assert normalize(digits) == spelled(digits)
