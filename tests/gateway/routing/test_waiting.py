"""The line of new replies waiting for spare time (`gateway.routing.waiting`) over a scripted
`pick`: a refusal time clears waits, and is reserved when a change lets it in; one that time
will not clear is answered at once; one client's replies wait at most `per_client` at once.
No sleeps and no timing: the waits are long, and a change (`changed`) is what moves them."""

from __future__ import annotations

import asyncio

from gateway.aio import loop_time
from gateway.routing.admission import Refusal
from gateway.routing.waiting import WaitingLine
from tests.support.steps import until

FULL = Refusal("replies in progress would fall behind", 1, deferrable=True)
DOWN = Refusal("no model server is reachable", 2, "tts_unavailable")


class Picker:
    """`pick` answering what the test says now, each budget it was given recorded."""

    def __init__(self, answer: str | Refusal) -> None:
        self.answer = answer
        self.budgets: list[float | None] = []

    async def __call__(self, budget_s: float | None) -> str | Refusal:
        self.budgets.append(budget_s)
        return self.answer


def reserve(server: str) -> str:
    return f"placed on {server}"


async def test_a_deferrable_refusal_waits_and_is_reserved_when_a_change_lets_it_in() -> None:
    line = WaitingLine(loop_time)
    pick = Picker(FULL)
    waiting = asyncio.create_task(line.admit(pick, reserve, 3.0, 30.0, 600.0, 16, "alice"))
    await until(lambda: line.count == 1 and len(pick.budgets) == 2)
    pick.answer = "a"
    line.changed()
    assert await waiting == "placed on a"
    assert line.count == 0
    assert pick.budgets[0] == 3.0
    assert all(b is not None and b <= 3.0 for b in pick.budgets)  # shrinking by the wait


async def test_a_refusal_time_will_not_clear_is_answered_at_once() -> None:
    line = WaitingLine(loop_time)
    pick = Picker(DOWN)
    assert await line.admit(pick, reserve, 3.0, 30.0, 600.0, 16) is DOWN
    assert (line.count, pick.budgets) == (0, [3.0])


async def test_no_budget_or_no_wait_is_answered_at_once() -> None:
    line = WaitingLine(loop_time)
    assert await line.admit(Picker(FULL), reserve, None, 30.0, 600.0, 16) is FULL
    assert await line.admit(Picker(FULL), reserve, 3.0, 0.0, 600.0, 16) is FULL
    assert await line.admit(Picker("a"), reserve, None, 0.0, 600.0, 16) == "placed on a"


async def test_a_server_free_now_goes_to_those_already_waiting_first() -> None:
    """A new reply that could be placed at once joins the line while others wait (arrival
    order), and one over `max_waiting` is answered with what it was picked."""
    line = WaitingLine(loop_time)
    pick = Picker(FULL)
    first = asyncio.create_task(line.admit(pick, reserve, 3.0, 30.0, 600.0, 2))
    await until(lambda: line.count == 1)
    pick.answer = "a"  # free now: the next one queues behind the first anyway
    second = asyncio.create_task(line.admit(pick, reserve, 3.0, 30.0, 600.0, 2))
    await until(lambda: line.count == 2)
    assert await line.admit(pick, reserve, 3.0, 30.0, 600.0, 2) == "placed on a"  # line full
    line.changed()
    assert await first == "placed on a"
    assert await second == "placed on a"
    assert line.count == 0


async def test_one_clients_replies_wait_at_most_per_client_at_once() -> None:
    line = WaitingLine(loop_time)
    pick = Picker(FULL)
    alice = asyncio.create_task(line.admit(pick, reserve, 3.0, 30.0, 600.0, 16, "alice", 1))
    await until(lambda: line.count == 1)
    again = await line.admit(pick, reserve, 3.0, 30.0, 600.0, 16, "alice", 1)
    assert isinstance(again, Refusal)
    assert again.reason == "1 of this client's replies already wait for spare time"
    assert not again.deferrable
    bob = asyncio.create_task(line.admit(pick, reserve, 3.0, 30.0, 600.0, 16, "bob", 1))
    await until(lambda: line.count == 2)  # another client's waits
    alice.cancel()  # its client left while it waited
    await asyncio.gather(alice, return_exceptions=True)
    assert line.count == 1
    pick.answer = "a"
    line.changed()
    assert await bob == "placed on a"
    assert line.count == 0
