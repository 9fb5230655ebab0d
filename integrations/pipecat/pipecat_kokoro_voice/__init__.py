"""pipecat TTS service for the Kokoro voice gateway: streamed text in over one WebSocket,
24 kHz PCM and word timestamps out."""

from pipecat_kokoro_voice.tts import (
    KokoroVoiceError,
    KokoroVoiceTTSService,
    KokoroVoiceTTSSettings,
    speak_ws_url,
)

__all__ = ["KokoroVoiceError", "KokoroVoiceTTSService", "KokoroVoiceTTSSettings", "speak_ws_url"]
