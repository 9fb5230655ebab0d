"""A reply's lifecycle (`gateway.service.gate.Gate.start`): one owner takes its session, its
cancel handle, its rate and its place on a model server, and gives every one of them back on
every exit path; a refusal at any step holds nothing. Over the real pool and a fake model
server on loopback."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from gateway.access.keys import Client
from gateway.config import Settings
from gateway.errors import BadRequest, Overloaded
from gateway.metrics import GatewayMetrics
from gateway.service.gate import Admitted, Gate
from gateway.service.runtime import Runtime
from gateway.transports.resuming import ResumingTransport
from tests.support.servers import RunningServer, free_port
from tests.support.steps import until

WEB = Client("web")


@contextlib.asynccontextmanager
async def gate_on(url: str, **settings: object) -> AsyncIterator[Gate]:
    config = Settings(model_server_url=url, **settings)  # type: ignore[arg-type]
    runtime = Runtime(config)
    try:
        yield Gate(config, GatewayMetrics(), runtime)
    finally:
        await runtime.aclose()


def held(gate: Gate) -> tuple[int, int, int]:
    """(sessions open, cancellable replies, replies counted on model servers)."""
    assert gate.runtime.pool is not None
    return gate.sessions.total, len(gate.live), sum(u.replies for u in gate.runtime.pool.upstreams)


async def test_everything_a_reply_holds_comes_back_on_every_exit(
    own_fake_server: RunningServer,
) -> None:
    async with gate_on(own_fake_server.http_url, admission=False) as gate:
        async with gate.start(WEB, prompt=False, cancellable="u1") as admitted:
            assert held(gate) == (1, 1, 1)
            assert admitted.live is gate.live[("web", "u1")]
            assert admitted.tts.budget.deadline is not None
        assert held(gate) == (0, 0, 0)
        assert admitted.live is not None
        assert admitted.live.heard.result() is None  # a cancel waiting for it hears nothing

        with pytest.raises(RuntimeError, match="the route failed"):
            async with gate.start(WEB, prompt=False, cancellable="u1"):
                raise RuntimeError("the route failed")
        assert held(gate) == (0, 0, 0)

        # closed twice (the block, and a task that never ran): given back once
        async with gate.start(WEB, prompt=False) as admitted:
            admitted.close()
            assert held(gate) == (0, 0, 0)
        assert held(gate) == (0, 0, 0)
        assert gate.sessions.of("web") == 0


async def test_a_busy_utterance_is_refused_before_the_rate_is_charged(
    own_fake_server: RunningServer,
) -> None:
    async with gate_on(own_fake_server.http_url, admission=False) as gate:
        async with gate.start(WEB, prompt=False, cancellable="u1"):
            with pytest.raises(BadRequest) as busy:
                async with gate.start(WEB, prompt=False, cancellable="u1"):
                    pass
            assert busy.value.code == "busy"
            # only the reply that plays was counted and placed; the refused one holds nothing
            assert gate.reply_rate.used("web", gate.clock()) == 1
            assert held(gate) == (1, 1, 1)
        assert held(gate) == (0, 0, 0)


async def test_a_refused_reply_gives_back_its_session_and_its_cancel_handle() -> None:
    async with gate_on(f"http://127.0.0.1:{free_port()}") as gate:  # nothing listens there
        with pytest.raises(Overloaded) as refused:
            async with gate.start(WEB, prompt=False, cancellable="u1"):
                pass
        assert refused.value.code == "tts_unavailable"
        assert held(gate) == (0, 0, 0)
        gate.draining.set()
        with pytest.raises(Overloaded) as restarting:
            async with gate.start(WEB, prompt=False):
                pass
        assert restarting.value.code == "restarting"
        assert held(gate) == (0, 0, 0)


async def test_an_llm_answer_is_charged_its_tokens_when_it_ends(
    own_fake_server: RunningServer,
) -> None:
    async with gate_on(own_fake_server.http_url, admission=False) as gate:
        async with gate.start(WEB, prompt=True) as admitted:
            admitted.text_chars = lambda: 41  # the answer so far
            assert gate.token_rate.used("web", gate.clock()) == 0
        assert gate.token_rate.used("web", gate.clock()) == 11  # 4 characters a token
        # settled as the reply ends (before its agent_end is out), then closed: charged once
        async with gate.start(WEB, prompt=True) as admitted:
            admitted.text_chars = lambda: 8
            admitted.settle()
            assert gate.token_rate.used("web", gate.clock()) == 13
            admitted.text_chars = lambda: 800  # nothing after the settlement counts
        assert gate.token_rate.used("web", gate.clock()) == 13
        async with gate.start(WEB, prompt=False) as admitted:
            admitted.text_chars = lambda: 400  # text the client gave: no tokens
        assert gate.token_rate.used("web", gate.clock()) == 13


async def test_a_reply_is_alone_only_when_its_server_has_nothing_else_to_do(
    own_fake_server: RunningServer,
) -> None:
    """Its first chunk then needs no slack (`ChunkPlan.alone`): the first reply on an idle
    server is alone, one that joins it is not, and the next after both ended is again."""
    async with gate_on(own_fake_server.http_url, admission=False) as gate:
        async with gate.start(WEB, prompt=False) as first:
            assert first.alone
            async with gate.start(WEB, prompt=False) as second:
                assert not second.alone
        async with gate.start(WEB, prompt=False) as again:
            assert again.alone


async def test_one_sessions_replies_wait_for_spare_time_in_turn_not_refused(
    own_fake_server: RunningServer,
) -> None:
    """A WebSocket's three contexts opened at once while its server has no spare time (a
    pipecat turn of three sentences): the second waits for spare time, and the third, which
    the line refused at once (a client's replies wait one at a time), waits behind the second
    and is admitted after it; another session of the same client is still refused."""
    async with gate_on(own_fake_server.http_url, admission_wait_s=30.0) as gate:
        pool = gate.runtime.pool
        assert pool is not None
        session = await gate.open_session(WEB)
        async with contextlib.AsyncExitStack() as replies:
            first = await replies.enter_async_context(
                gate.start(WEB, prompt=False, session=session)
            )
            in_turn = gate.turns[session]

            async def admitted_next() -> Admitted:
                return await replies.enter_async_context(
                    gate.start(WEB, prompt=False, session=session)
                )

            second = asyncio.create_task(admitted_next())  # the first is starting: it waits
            await until(lambda: pool.waiting == 1)
            third = asyncio.create_task(admitted_next())
            await until(lambda: in_turn.behind == 1)  # behind the second, not refused
            with pytest.raises(Overloaded, match="of this client's replies already wait"):
                async with gate.start(WEB, prompt=False):  # another session of the client's
                    pass
            first.close()  # the first ends: the second is admitted, the third takes its place
            await until(lambda: second.done() and pool.waiting == 1)
            assert not third.done()
            (await second).close()
            assert isinstance((await third).tts, ResumingTransport)
        assert (in_turn.behind, pool.waiting) == (0, 0)
        session.release()
        assert held(gate) == (0, 0, 0)
