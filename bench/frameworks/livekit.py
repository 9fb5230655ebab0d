"""LiveKit Agents' client: `livekit.plugins.kokoro_voice.TTS`, one utterance through LiveKit's
stream API (`push_text`, then `end_input`), as an agent's TTS node drives it.

Timed from the moment the text is pushed, so the pool's WebSocket connect is inside (a fresh
`TTS`: an agent's first utterance) to the first audio frame LiveKit hands its consumer and the
first frame that carries a timed word (LiveKit attaches the aligned transcript to the audio
frames, so a word is seen with the frame after it arrived, never before the first audio).
"""

from __future__ import annotations

import time

from livekit.agents.types import USERDATA_TIMED_TRANSCRIPT, APIConnectOptions
from livekit.agents.utils import http_context
from livekit.plugins import kokoro_voice

from bench.frameworks import FrameworkRun

BYTES_PER_SECOND = 48_000  # 24 kHz, 16-bit mono


async def run(url: str, api_key: str | None, text: str, voice: str) -> FrameworkRun:
    first_audio: float | None = None
    first_word: float | None = None
    audio_bytes = 0
    words: list[str] = []
    async with (
        http_context.open(),
        kokoro_voice.TTS(base_url=url, api_key=api_key, voice=voice) as tts,
        tts.stream(conn_options=APIConnectOptions(max_retry=0)) as stream,
    ):
        start = time.perf_counter()
        stream.push_text(text)
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
    if first_audio is None:
        raise RuntimeError("the LiveKit stream ended with no audio")
    return FrameworkRun(
        client="livekit",
        first_audio_s=first_audio,
        first_word_s=first_word,
        audio_s=audio_bytes / BYTES_PER_SECOND,
        words=tuple(words),
    )
