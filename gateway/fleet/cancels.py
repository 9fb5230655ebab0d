"""A barge-in for a reply another gateway of the fleet holds, carried over Redis pub/sub.

`POST /v1/speak/{id}/cancel` reaches one gateway of the fleet, and the SSE reply it names may
play on another. The gateway that does not hold it publishes the cancel (who asks, which
utterance, `played_ms`) on the fleet's channel; every other gateway looks for the reply with
the same rule as its own route (the key and token subject that started it, or the key
itself) and answers on the asking gateway's own channel: not here, at once, or, from the one
that holds it, what the listener heard once the reply has stopped (at most `HEARD_S`). The
asker knows how many gateways heard the cancel (`PUBLISH` says), so "nobody holds it" is
answered as soon as each has said so, not after a timeout."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import orjson
import redis.asyncio as aioredis

from gateway.access.keys import Client
from gateway.fleet.store import FAILURES, Store

log = logging.getLogger(__name__)

HEARD_S = 10.0  # a reply told to stop says what was heard within this (the route's own wait)
ANSWER_S = HEARD_S + 2.0  # an asker waits this long for the gateways' answers, at most


@dataclass(frozen=True)
class Stopped:
    """A reply stopped by a cancel: what its listener heard (None if it could not say in
    time)."""

    heard_text: str | None


# the cancel as the gateway that holds the reply does it: None when it holds none of `client`'s
CancelHere = Callable[[Client, str, float | None], Awaitable[Stopped | None]]


class FleetCancels:
    def __init__(self, store: Store, cancel_here: CancelHere) -> None:
        self.store = store
        self.cancel_here = cancel_here
        self.name = store.gateway
        self.requests = store.key("cancels")
        self.answers = store.key("cancels", self.name)
        # pub/sub waits on its connection with no read deadline (the store's calls keep theirs)
        kwargs = store.redis.connection_pool.connection_kwargs
        self._listener = aioredis.Redis(
            connection_pool=aioredis.ConnectionPool(
                connection_class=store.redis.connection_pool.connection_class,
                **{**kwargs, "socket_timeout": None},
            )
        )
        self.subscribed = False
        self._asked: dict[str, asyncio.Queue[dict[str, object]]] = {}
        self._listening: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._listening = asyncio.create_task(self._listen(), name="fleet-cancels")

    async def cancel(
        self, client: Client, utterance_id: str, played_ms: float | None
    ) -> Stopped | None:
        """The reply stopped on whichever other gateway holds it; None when none does (or the
        store does not answer)."""
        if not self.subscribed:  # its answers would not be heard
            return None
        ask = str(uuid.uuid4())
        answers: asyncio.Queue[dict[str, object]] = asyncio.Queue()
        self._asked[ask] = answers
        message = orjson.dumps(
            {
                "ask": ask,
                "from": self.name,
                "client": [client.name, client.via, client.subject],
                "utterance_id": utterance_id,
                "played_ms": played_ms,
            }
        )
        try:
            heard_by = await self.store.call(lambda redis: redis.publish(self.requests, message))
            others = (heard_by or 0) - (1 if self.subscribed else 0)
            async with asyncio.timeout(ANSWER_S):
                while others > 0:
                    answer = await answers.get()
                    if answer.get("found"):
                        heard = answer.get("heard_text")
                        return Stopped(heard if isinstance(heard, str) else None)
                    others -= 1
        except TimeoutError:
            pass
        finally:
            del self._asked[ask]
        return None

    async def _listen(self) -> None:
        while True:
            pubsub = self._listener.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self.requests, self.answers)
                self.subscribed = True
                async for message in pubsub.listen():
                    self._received(message["channel"], message["data"])
            except FAILURES:
                pass  # Redis went away: subscribed again once it can be
            finally:
                self.subscribed = False
                with contextlib.suppress(*FAILURES):
                    await pubsub.aclose()
            await asyncio.sleep(self.store.probe_s)

    def _received(self, channel: bytes | str, data: bytes | str) -> None:
        try:
            message = orjson.loads(data)
            channel = channel.decode() if isinstance(channel, bytes) else channel
            if channel == self.answers:
                queue = self._asked.get(str(message["ask"]))
                if queue is not None:
                    queue.put_nowait(message)
                return
            if message["from"] == self.name:
                return
            name, via, subject = message["client"]
            played = message["played_ms"]
            asked = (
                Client(str(name), via=str(via), subject=None if subject is None else str(subject)),
                str(message["utterance_id"]),
                None if played is None else float(played),
            )
            reply_to = self.store.key("cancels", str(message["from"]))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            log.warning("fleet: a cancel message that is not one was ignored")
            return
        task = asyncio.create_task(self._answer(str(message["ask"]), asked, reply_to))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(
        self, ask: str, asked: tuple[Client, str, float | None], reply_to: str
    ) -> None:
        stopped = await self.cancel_here(*asked)
        answer: dict[str, object] = {"ask": ask, "found": stopped is not None}
        if stopped is not None:
            answer["heard_text"] = stopped.heard_text
        await self.store.call(lambda redis: redis.publish(reply_to, orjson.dumps(answer)))

    async def aclose(self) -> None:
        for task in (self._listening, *self._tasks):
            if task is not None:
                task.cancel()
        for task in (self._listening, *self._tasks):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        with contextlib.suppress(*FAILURES):
            await self._listener.aclose()
