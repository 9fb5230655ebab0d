from __future__ import annotations

import pytest

from model_server.text.normalize import normalize


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
