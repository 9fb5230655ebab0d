"""What the plans learn (`gateway.reply.plan.rates`), and the frozen reading of it a timeline is
computed from (`Rates`)."""

from __future__ import annotations

import pytest

from gateway.reply.plan.rates import EarlyAudio, Rates, SpeechRate
from kokoro_contract.speed import SpeedModel


def test_rates_read_the_learned_speeds_as_they_are_now() -> None:
    speed = SpeedModel(prior_a=0.35, prior_b=0.025)
    first = SpeedModel(prior_a=0.25, prior_b=0.002)
    early = EarlyAudio()
    rates = Rates.of(speed, SpeechRate(14.0), 1.25, first, early)
    # the first audio is the whole synthesis until the server shows it speaks progressively
    assert rates == Rates((0.35, 0.025), None, 17.5, None)
    assert (rates.synth_s(40), rates.first_s(40), rates.audio_s(35)) == (1.35, 1.35, 2.0)
    assert rates.early(3.0) == 3.0
    early.assume(0.6)
    progressive = Rates.of(speed, SpeechRate(14.0), 1.25, first, early)
    assert progressive == Rates((0.35, 0.025), (0.25, 0.002), 17.5, 0.6)
    assert progressive.first_s(40) == pytest.approx(0.33)
    assert progressive.first_s(0) == 0.25
    assert (progressive.early(3.0), progressive.early(0.4)) == (0.6, 0.4)
    assert Rates.of(speed, SpeechRate(14.0), 1.25, None, early).first is None
    # a reading is a value: what another reply's report teaches the shared speed is a new one
    speed.observe(40, 2.7)
    assert Rates.of(speed, SpeechRate(14.0), 1.25, first, early) != progressive
