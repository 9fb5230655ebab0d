"""`WS /v1/twilio/ws?stream_sid=...`: the speak WebSocket's protocol 2 (its rules, its
connection) with a phone call's stream as its voice. The agent that relays the call sends the
same context messages (`speak`, `text`, `flush`, `close_context`, `cancel`) and forwards what
Twilio sends it (`mark` echoes; `connected`, `start`, `media`, `dtmf`, `stop` are taken and
ignored); the gateway answers with Twilio's own messages for the stream (`media`, `mark`,
`clear`: every frame with an `event` goes to Twilio verbatim) beside protocol 2's events for the
agent (every frame with a `type`), and sends no binary frames.

- Every context speaks `ulaw_8000` (a `speak` naming another format is refused).
- The call has one voice: the contexts' audio plays in the order they were opened (not in the
  order their audio comes), each after the one before it has ended (held here meanwhile; a
  context refused, or closed idle, gives its turn on), framed, paced and marked by
  `media.TwilioStream`.
- `cancel` is a barge-in: when the context is the one on the phone, `clear` goes to Twilio at
  once (the phone's buffer is emptied) before the context stops; a context still waiting its
  turn is dropped. The next context's audio follows.
- A mark's echo is answered `{"type": "played", "context_id", "audio_ms", "played_ms"}`: that
  context has been played to its end on the phone, and the stream's total so far.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

import orjson
from fastapi import WebSocket

from gateway.access.keys import Client
from gateway.access.quotas import Lease
from gateway.aio import cancel_and_wait
from gateway.errors import BadRequest
from gateway.reply.events import AudioStreamEnd, Event
from gateway.service import GatewayService
from gateway.speak_ws.connection import SpeakConnection
from gateway.speak_ws.protocol import (
    CONTEXT_KEY,
    ClientMessage,
    Invalid,
    parse_client_message,
    parse_client_object,
)
from gateway.speak_ws.session import Action, SendFrame, StartUtterance
from gateway.twilio.media import TwilioStream, UtterancePlayed
from kokoro_contract.ws_sender import ClientGone

FORMAT = "ulaw_8000"


class TwilioConnection(SpeakConnection):
    def __init__(
        self,
        ws: WebSocket,
        service: GatewayService,
        client: Client,
        lease: Lease,
        stream_sid: str,
    ) -> None:
        super().__init__(ws, service, client, lease, version=2)
        self.stream = TwilioStream(stream_sid)
        # the contexts in the order they were opened; the first is on the phone
        self._turns: deque[str] = deque()
        self._held: dict[str, list[bytes]] = {}  # the audio of those waiting their turn
        self._voiced: set[str] = set()  # of those, the ones that have had audio
        self._done: set[str] = set()  # ... that have ended
        self._whole: set[str] = set()  # ... whose audio ended as it should (a mark is due)
        self._cancelled: set[str] = set()  # their late audio is dropped
        self._wake = asyncio.Event()  # the stream has something new to send

    async def run(self) -> None:
        pacing = asyncio.create_task(self._pace())
        try:
            await super().run()
        finally:
            await cancel_and_wait(pacing)

    async def _pace(self) -> None:
        """Send what the stream says is due, when it is due."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                for text in self.stream.send_now(loop.time()):
                    await self._sender.send(text)
                due = self.stream.due_at()
                timeout = None if due is None else max(0.0, due - loop.time())
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wake.wait()
        except ClientGone:
            self._dropped = True

    # --- the agent's messages -------------------------------------------------------------------

    def _parse(self, text: str | None) -> ClientMessage | list[Action]:
        """Twilio's messages (an `event`) for the stream; the agent's (a `type`) as protocol 2's,
        in `ulaw_8000`."""
        try:
            msg = orjson.loads(text) if text is not None else None
        except orjson.JSONDecodeError:
            msg = None
        if not isinstance(msg, dict):
            return parse_client_message(text, 2)  # its error, as protocol 2 says it
        if "event" in msg:
            return self._from_twilio(msg)
        if msg.get("type") == "speak" and msg.setdefault("format", FORMAT) != FORMAT:
            error = BadRequest(
                f"a Twilio stream speaks {FORMAT} only (8000 Hz mu-law)", code="invalid_field"
            )
            return Invalid(error)
        return parse_client_object(msg, 2)

    def _from_twilio(self, msg: dict[str, Any]) -> ClientMessage | list[Action]:
        received = self.stream.received(msg)
        if isinstance(received, Invalid):
            return Invalid(received.error)
        if isinstance(received, UtterancePlayed):
            body = {
                "type": "played",
                CONTEXT_KEY: received.utterance_id,
                "audio_ms": received.audio_ms,
                "played_ms": received.played_ms,
            }
            return [SendFrame(orjson.dumps(body).decode())]
        return []  # taken: nothing to do

    # --- the voice ------------------------------------------------------------------------------

    async def _start(self, start: StartUtterance) -> None:
        uid = start.utterance_id
        self._cancelled.discard(uid)  # an id used again is a new context
        self._turns.append(uid)  # its turn comes in the order it was opened
        await super()._start(start)

    async def _audio(self, utterance_id: str, data: bytes) -> None:
        if utterance_id in self._cancelled or utterance_id not in self._turns:
            return
        self._voiced.add(utterance_id)
        if self._turns[0] == utterance_id:
            self.stream.audio(utterance_id, data)
            self._wake.set()
        else:
            self._held.setdefault(utterance_id, []).append(data)

    async def _sent(self, utterance_id: str, event: Event) -> None:
        if isinstance(event, AudioStreamEnd) and utterance_id in self._turns:
            self._whole.add(utterance_id)
            self._done.add(utterance_id)
            self._next_turns()

    def _ended(self, utterance_id: str) -> None:
        """A context that ended without its audio's end (refused before its reply ran, or
        stopped: closed idle) gives its turn on too: marked if it said something, else passed
        over."""
        if utterance_id in self._turns and utterance_id not in self._done:
            self._done.add(utterance_id)
            self._next_turns()

    async def _cancelling(self, utterance_id: str) -> None:
        self._cancelled.add(utterance_id)
        if self._turns and self._turns[0] == utterance_id:
            await self._sender.send(self.stream.barge_in())
            self._forget(self._turns.popleft())
            self._next_turns()
        elif utterance_id in self._turns:
            self._turns.remove(utterance_id)
            self._forget(utterance_id)

    def _forget(self, utterance_id: str) -> None:
        self._held.pop(utterance_id, None)
        for kept in (self._voiced, self._done, self._whole):
            kept.discard(utterance_id)

    def _next_turns(self) -> None:
        """Each context on the phone that has ended gives its turn to the next, whose audio
        held so far goes to the stream; an ended context's mark follows its audio (one that
        ended with no audio and no end of it, refused, has none)."""
        while self._turns:
            head = self._turns[0]
            for data in self._held.pop(head, []):
                self.stream.audio(head, data)
            if head not in self._done:
                break
            if head in self._voiced or head in self._whole:
                self.stream.utterance_end(head)
            self._turns.popleft()
            self._forget(head)
        self._wake.set()
