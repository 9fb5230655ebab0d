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


# --- what an agent's answers are full of, read as a person would read it aloud ---------------

AGENT_STRINGS = [
    (
        "Email me at jane.doe@example.com today.",
        "Email me at jane dot doe at example dot com today.",
    ),
    (
        "Write to support+orders@shop.example.co.uk.",
        "Write to support plus orders at shop dot example dot co dot uk.",
    ),
    (
        "Reach us at help_desk@acme-corp.io.",
        "Reach us at help underscore desk at acme dash corp dot io.",
    ),
    (
        "Visit https://www.example.com/orders/1042 for details.",
        "Visit w w w dot example dot com slash orders slash one zero four two for details.",
    ),
    ("Go to example.com/help.", "Go to example dot com slash help."),
    ("See www.acme.io.", "See w w w dot acme dot io."),
    (
        "The docs are at https://docs.acme.dev/api/v2?lang=en#auth.",
        "The docs are at docs dot acme dot dev slash api slash v two question mark lang equals "
        "en hash auth.",
    ),
    (
        "Open http://localhost:8080/status now.",
        "Open localhost colon eight zero eight zero slash status now.",
    ),
    ("Check status.acme.com, then retry.", "Check status dot acme dot com, then retry."),
    ("Call +1 415 555 0123.", "Call plus one, four one five, five five five, zero one two three."),
    (
        "Call (415) 555-0123 before noon.",
        "Call four one five, five five five, zero one two three before noon.",
    ),
    (
        "Dial 415-555-0123 or 415.555.0199.",
        "Dial four one five, five five five, zero one two three or four one five, five five "
        "five, zero one nine nine.",
    ),
    (
        "Our London office is +44 20 7946 0958.",
        "Our London office is plus four four, two zero, seven nine four six, zero nine five eight.",
    ),
    (
        "Text +14155550123 anytime.",
        "Text plus one four one five five five five zero one two three anytime.",
    ),
    (
        "In Germany call +49 30 901820.",
        "In Germany call plus four nine, three zero, nine zero one eight two zero.",
    ),
    ("Your order ORD-48213 has shipped.", "Your order O R D four eight two one three has shipped."),
    ("Reference 7GH3K2 is valid.", "Reference seven G H three K two is valid."),
    ("Ticket #48213 is closed.", "Ticket number four eight two one three is closed."),
    ("Use code SAVE20 at checkout.", "Use code S eh V E two zero at checkout."),
    ("Booking AB12CD34 is confirmed.", "Booking eh B one two C D three four is confirmed."),
    (
        "Flight UA-1234 leaves at 5:45 pm.",
        "Flight U eh one two three four leaves at five forty-five PM.",
    ),
    ("It arrives on 2025-03-07.", "It arrives on March seventh, twenty twenty-five."),
    ("It ships 12/24/2025.", "It ships December twenty-fourth, twenty twenty-five."),
    ("Pay by 3/7/25.", "Pay by March seventh, twenty-five."),
    ("The sale ends March 3rd.", "The sale ends March third."),
    ("The sale ends March 3.", "The sale ends March third."),
    ("See you on Jan. 15, 2026.", "See you on January fifteenth, twenty twenty-six."),
    ("Delivery by May 1, 2025.", "Delivery by May first, twenty twenty-five."),
    ("The total is ¥5000.", "The total is five thousand yen."),
    ("That is ₹1,250.50.", "That is one thousand, two hundred and fifty rupees and fifty paise."),
    ("It costs €12.5.", "It costs twelve euros and fifty cents."),
    ("It is 20 USD.", "It is twenty US dollars."),
    ("The price is USD 14.99.", "The price is fourteen US dollars and ninety-nine cents."),
    ("That comes to 100 EUR.", "That comes to one hundred euros."),
    ("It is 50 CHF.", "It is fifty Swiss francs."),
    ("The fee is CAD 7.25.", "The fee is seven Canadian dollars and twenty-five cents."),
    ("A ₩10,000 voucher.", "A ten thousand won voucher."),
    ("The run is 5 km.", "The run is five kilometers."),
    ("It weighs 2.5 kg.", "It weighs two point five kilograms."),
    ("Drive 60 mph.", "Drive sixty miles per hour."),
    ("Only 1 km left.", "Only one kilometer left."),
    ("Get 20 GB of data.", "Get twenty gigabytes of data."),
    ("Speeds up to 3.2 GHz.", "Speeds up to three point two gigahertz."),
    ("It is 72°F outside.", "It is seventy-two degrees Fahrenheit outside."),
    ("Set it to 21 °C.", "Set it to twenty-one degrees Celsius."),
    ("Wait 30 min please.", "Wait thirty minutes please."),
    ("It uses 1.5 kWh a day.", "It uses one point five kilowatt hours a day."),
    ("Latency is 120 ms.", "Latency is one hundred and twenty milliseconds."),
    ("A 12 oz cup.", "A twelve ounces cup."),
    ("He is 6 ft tall.", "He is six feet tall."),
    ("That is 1 lb.", "That is one pound."),
    ("Use 250 ml of water.", "Use two hundred and fifty milliliters of water."),
    ("The A.I. team won.", "The eh I team won."),
    ("Meet at 10:30 a.m.", "Meet at ten thirty AM."),
    (
        "Your balance is $1,234.56.",
        "Your balance is one thousand, two hundred and thirty-four dollars and fifty-six cents.",
    ),
    (
        "Call 1-800-555-0199 now.",
        "Call one, eight zero zero, five five five, zero one nine nine now.",
    ),
    ("Due 03-07-2025.", "Due March seventh, twenty twenty-five."),
    (
        "The server is 192.168.1.10.",
        "The server is one hundred and ninety-two point one hundred and sixty-eight point one "
        "point ten.",
    ),
    ("Read report.pdf and Node.js docs.", "Read report.pdf and Node.js docs."),
    ("Wait 5 mins.", "Wait five minutes."),
    ("Call me at 555-0199.", "Call me at five five five, zero one nine nine."),
    ("Room 101 is free.", "Room one hundred and one is free."),
    ("It took 2 hours.", "It took two hours."),
    ("Pages 10-20 are missing.", "Pages ten-twenty are missing."),
]


@pytest.mark.parametrize(("text", "spoken"), AGENT_STRINGS)
def test_agent_strings_read_as_a_person_would(text: str, spoken: str) -> None:
    assert normalize(text) == spoken
    assert normalize(spoken) == spoken  # nothing left to read again
