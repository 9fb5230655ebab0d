"""The baseline: the gateway's own speak WebSocket driven directly with `websockets`, as a
client that streams its text would: `speak` (no text, `timestamps: true`), the text as word
deltas, `flush`; timed from the first message sent to the first binary audio frame and the
first `words` frame."""

from __future__ import annotations

import json
import time
import uuid

from kokoro_voice_client import BYTES_PER_SECOND as BYTES_PER_SECOND
from kokoro_voice_client import speak_ws as msg
from kokoro_voice_client import speak_ws_url, split_audio_frame
from websockets.asyncio.client import connect

from bench.frameworks import FrameworkRun


def deltas(text: str) -> list[str]:
    """The text as an LLM would stream it: word by word, each with its following space."""
    words = text.split(" ")
    return [w + " " for w in words[:-1]] + [words[-1]]


async def run(url: str, api_key: str | None, text: str, voice: str) -> FrameworkRun:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    uid = uuid.uuid4().hex[:16]
    async with connect(speak_ws_url(url), additional_headers=headers, max_size=None) as ws:
        started = time.perf_counter()
        await ws.send(msg.encode(msg.speak(uid, voice)))
        for delta in deltas(text):
            await ws.send(msg.encode(msg.text(delta)))
        await ws.send(msg.encode(msg.FLUSH))
        first_audio: float | None = None
        first_word: float | None = None
        audio_bytes = 0
        words: list[str] = []
        async for frame in ws:
            now = time.perf_counter() - started
            if isinstance(frame, bytes):
                owner, pcm = split_audio_frame(frame)
                if owner != uid:
                    continue
                first_audio = now if first_audio is None else first_audio
                audio_bytes += len(pcm)
                continue
            event = json.loads(frame)
            if event["type"] == "words":
                first_word = now if first_word is None else first_word
                words += [w["word"] for w in event["words"]]
            elif event["type"] == "error":
                raise RuntimeError(f"gateway error: {event}")
            elif event["type"] == "agent_end":
                break
        await ws.send(msg.encode(msg.CLOSE))
        async for _ in ws:  # until the gateway's close (1000)
            pass
    if first_audio is None:
        raise RuntimeError("no audio came back")
    return FrameworkRun(
        "gateway_ws", first_audio, first_word, audio_bytes / BYTES_PER_SECOND, tuple(words)
    )
