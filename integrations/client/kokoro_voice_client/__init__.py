"""The Kokoro voice gateway's client side, pure (no I/O, no dependencies): its URLs, the speak
WebSocket's messages, audio frames and error rule, and the `data` of Server-Sent Events. The
pipecat and LiveKit plugins, the frameworks' bench and the tests all speak the gateway through
it."""

from kokoro_voice_client.errors import GatewayError, ends_context, ends_utterance, is_stale
from kokoro_voice_client.speak_ws import (
    BYTES_PER_SECOND,
    NUM_CHANNELS,
    SAMPLE_RATE,
    split_audio_frame,
)
from kokoro_voice_client.sse import SSEDataDecoder
from kokoro_voice_client.urls import Endpoints, endpoints, speak_ws_url

__all__ = [
    "BYTES_PER_SECOND",
    "NUM_CHANNELS",
    "SAMPLE_RATE",
    "Endpoints",
    "GatewayError",
    "SSEDataDecoder",
    "endpoints",
    "ends_context",
    "ends_utterance",
    "is_stale",
    "speak_ws_url",
    "split_audio_frame",
]
