"""LiveKit Agents: `livekit.plugins.kokoro_voice.TTS`, one utterance through LiveKit's stream API
as an agent's TTS node drives it: the text pushed word by word at once (`push_text`), then
`end_input`. The TTS's shared WebSocket is opened first (what `AgentSession` does with `prewarm()`;
the baseline times from an open WebSocket too), then timed from the first `push_text` to the
first audio frame LiveKit hands its consumer and the first frame that carries a timed word
(LiveKit attaches the aligned transcript to audio frames, so a word is never seen before the
first audio)."""

from __future__ import annotations

import time

from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT, APIConnectOptions
from livekit.agents.utils import http_context
from livekit.plugins import kokoro_voice

from bench.frameworks import FrameworkRun
from bench.frameworks.gateway_ws import BYTES_PER_SECOND, deltas


async def _warm(tts: kokoro_voice.TTS) -> None:
    """The shared WebSocket open before the clock starts (`prewarm()`, awaited)."""
    await tts._shared_socket(10)


async def run(url: str, api_key: str | None, text: str, voice: str) -> FrameworkRun:
    first_audio: float | None = None
    first_word: float | None = None
    audio_bytes = 0
    words: list[str] = []
    async with (
        http_context.open(),
        kokoro_voice.TTS(base_url=url, api_key=api_key, voice=voice) as tts,
    ):
        await _warm(tts)
        async with tts.stream(conn_options=APIConnectOptions(max_retry=0)) as stream:
            start = time.perf_counter()
            for delta in deltas(text):
                stream.push_text(delta)
            stream.end_input()
            async for event in stream:
                now = time.perf_counter() - start
                timed = event.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
                if first_audio is None:
                    first_audio = now
                if timed and first_word is None:
                    first_word = now
                audio_bytes += len(event.frame.data.tobytes())
                words += [str(word).strip() for word in timed]
        if tts._connects != 1:
            raise RuntimeError("the stream did not get the warmed connection")
    if first_audio is None:
        raise RuntimeError("the LiveKit stream ended with no audio")
    return FrameworkRun(
        client="livekit",
        first_audio_s=first_audio,
        first_word_s=first_word,
        audio_s=audio_bytes / BYTES_PER_SECOND,
        words=tuple(words),
    )
