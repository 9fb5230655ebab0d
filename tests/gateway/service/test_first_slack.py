"""The first chunk's slack, one setting (`--first-slack-s`): the chunk plan needs a new reply's
first chunk that long after it could be ready, and admission counts a reply not started yet as
having that much spare time. Both read the same value, and their defaults are one."""

from __future__ import annotations

import dataclasses

from gateway.config import Settings, parse_settings
from gateway.reply.plan.config import FIRST_SLACK_S, PlanConfig
from gateway.routing.admission import Candidate, LoadReport, refusal
from gateway.routing.pool import ModelServerPool
from gateway.service.replies import plan_config
from gateway.service.runtime import Runtime
from kokoro_contract.asks import Ask


def test_the_defaults_are_one_value() -> None:
    assert FIRST_SLACK_S == 1.0
    assert Settings().first_slack_s == FIRST_SLACK_S
    assert PlanConfig().first_slack_s == FIRST_SLACK_S
    assert Candidate("http://a:8080", None).first_slack_s == FIRST_SLACK_S
    pool_default = {f.name: f.default for f in dataclasses.fields(ModelServerPool)}
    assert pool_default["first_slack_s"] == FIRST_SLACK_S


async def test_the_setting_reaches_the_plan_and_admission() -> None:
    settings = parse_settings([], env={"GATEWAY_FIRST_SLACK_S": "2.5"})
    assert settings.first_slack_s == 2.5
    assert parse_settings(["--first-slack-s", "0"], env={}).first_slack_s == 0.0
    assert plan_config(settings).first_slack_s == 2.5
    runtime = Runtime(settings)
    try:
        assert runtime.pool is not None
        assert runtime.pool.first_slack_s == 2.5
    finally:
        await runtime.aclose()


def test_admission_gives_a_starting_reply_that_spare_time() -> None:
    """A reply not started yet, beside which a new one starts: refused with less slack than
    the new start takes from it (0.5 s of a 1.0 s first chunk on 2 workers, and the slowdown
    of its typical reply), taken with more."""
    load = LoadReport(2, 0, 0, 0.0, None, 0.1, 0.02, 1e9, 0.15, 0.03)
    assert refusal(load, budget_s=3.0, asks=(Ask(),), first_slack_s=0.4) is not None
    assert refusal(load, budget_s=3.0, asks=(Ask(),), first_slack_s=30.0) is None
